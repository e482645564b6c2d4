#!/usr/bin/env python3
"""`strata chat` driven as a user drives it (stories260K, greedy).

  turns     through a pipe: every line gets an answer after a "> " prompt; the
            second turn's answer is not the one the same line gets as a first
            turn (the history is in the prompt); after /reset the first line
            gets its first answer again; /exit ends with status 0, and so
            does the end of input; the unknown-template notice is one line
  ctrl-c    on a terminal (a pty): Ctrl-C during a long answer stops it
            ("(stopped)"), the prompt comes back, the next line is answered,
            /exit ends with 0
  bad       an unknown --chat-template is refused with one line, exit 1
"""
import os, pty, re, select, signal, subprocess, sys, time

strata = os.environ["STRATA_BIN"]
fix = os.environ["STRATA_FIXTURES"]
model = os.path.join(fix, "models/stories260K.gguf")
if not os.path.exists(model):
    print(f"SKIP: no fixtures under {fix}")
    sys.exit(77)
failed = 0


def check(ok, what):
    global failed
    print(("ok  " if ok else "FAIL"), what, flush=True)
    failed += not ok


def chat(lines, *args):
    r = subprocess.run([strata, "chat", "-m", model, "--temp", "0", "-n", "24", "-t", "1", *args],
                       input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                       timeout=120)
    # answers: what follows each "> " up to the next
    return r.returncode, r.stdout.split("> ")[1:], r.stderr


rc, ans, err = chat(["Hello", "Where is the cat?", "/reset", "Hello", "/exit"])
check(rc == 0 and len(ans) == 5, f"four turns and a last prompt, exit 0 ({rc}, {len(ans)})")
check(ans[0].strip() and ans[0] == ans[3], "after /reset the first line's answer again")
check("forgotten" in ans[2], "/reset says so")
rc2, alone, _ = chat(["Where is the cat?"])
check(rc2 == 0 and alone[0] != ans[1], "the second turn's answer comes from the history too")
check(len([l for l in err.splitlines() if "no chat template" in l]) == 1,
      "no template in the file: one line saying chatml is used")
rc, ans, err = chat(["Hello"])
check(rc == 0 and len(ans) == 2 and ans[0].strip(), "end of input ends with 0")

rc = subprocess.run([strata, "chat", "-m", model, "--chat-template", "jinja"],
                    capture_output=True, text=True, input="", timeout=60)
check(rc.returncode == 1 and "unknown chat template" in rc.stderr, "an unknown --chat-template")

# Ctrl-C on a terminal
pid, fd = pty.fork()
if pid == 0:
    # answers of up to 1500 tokens: seconds, where Ctrl-C comes after a few
    os.execv(strata, [strata, "chat", "-m", model, "--temp", "0.8", "--seed", "3", "-c", "4096",
                      "-n", "1500", "-t", "1"])
out = b""


def read_until(pat, timeout=60, start=0):
    """Read until pat is in what came after start."""
    global out
    deadline = time.time() + timeout
    while time.time() < deadline:
        if re.search(pat, out[start:]):
            return True
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                return bool(re.search(pat, out[start:]))
    return False


check(read_until(rb"> $"), "the prompt on a terminal")
mark = len(out)
os.write(fd, b"Tell me a long story\n")
# some of the answer has come: it is being generated
deadline = time.time() + 60
while len(out) < mark + 60 and time.time() < deadline:
    read_until(rb"(?!)", timeout=0.2)
os.write(fd, b"\x03")
check(read_until(rb"\(stopped\)\r?\n> "), "Ctrl-C stops the answer; the prompt comes back")
mark = len(out)
os.write(fd, b"Hi\n")
check(read_until(rb"^Hi\r?\n[^>][\s\S]*\n> $", timeout=120, start=mark),
      "the next line is answered")
os.write(fd, b"/exit\n")
_, status = os.waitpid(pid, 0)
check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "/exit: status 0")

print("FAILED" if failed else "all ok")
sys.exit(1 if failed else 0)
