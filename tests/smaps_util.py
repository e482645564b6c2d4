"""A process's mappings as /proc/PID/smaps lists them: what the tests that
look at how a mapping is held (its huge pages, its pages shared between
engines) read."""
import re

# a mapping's first line: its range, permissions, offset, device, inode and
# path (or a name such as [heap], or nothing)
HEAD = re.compile(r"[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def mappings(pid):
    """Each mapping of process pid, in address order: (its path or name,
    {field: the words after it}), e.g. ("/m.gguf", {"Rss": ["4", "kB"],
    "VmFlags": ["rd", "mr", ...], ...})."""
    out = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = HEAD.match(line)
            if head:
                out.append((head.group(1), {}))
            elif out:
                field, _, words = line.partition(":")
                out[-1][1][field] = words.split()
    return out
