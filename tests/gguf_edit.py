#!/usr/bin/env python3
"""gguf_edit.py IN OUT EDIT... - a copy of a GGUF file with header edits that
keep every length, so offsets and data stay where they were.  For the tests
of how strata rejects bad models.

  arch=NAME          general.architecture becomes NAME (same length)
  rename=OLD:NEW     tensor OLD is called NEW (same length)
  dim=NAME:I:V       tensor NAME's dimension I becomes V (V elements fewer
                     than the file holds keeps its data in bounds)
  u32=KEY:V          the unsigned 32-bit metadata value KEY becomes V
"""
import struct
import sys


def tensor_info(buf, name):
    """offset of the tensor's length-prefixed name in the header"""
    key = struct.pack('<Q', len(name)) + name.encode()
    at = buf.find(key)
    if at < 0:
        sys.exit(f'gguf_edit: no tensor {name}')
    return at


def main():
    src, dst, *edits = sys.argv[1:]
    buf = bytearray(open(src, 'rb').read())
    for e in edits:
        what, _, arg = e.partition('=')
        if what == 'arch':
            key = b'general.architecture'
            at = buf.find(struct.pack('<Q', len(key)) + key)
            # key, then type u32 (8: string), then u64 length, then the value
            vat = at + 8 + len(key) + 4
            n, = struct.unpack_from('<Q', buf, vat)
            if len(arg) != n:
                sys.exit('gguf_edit: arch names must have the same length')
            buf[vat + 8:vat + 8 + n] = arg.encode()
        elif what == 'rename':
            old, new = arg.split(':')
            if len(old) != len(new):
                sys.exit('gguf_edit: names must have the same length')
            at = tensor_info(buf, old)
            buf[at + 8:at + 8 + len(old)] = new.encode()
        elif what == 'dim':
            name, i, v = arg.split(':')
            at = tensor_info(buf, name) + 8 + len(name)
            nd, = struct.unpack_from('<I', buf, at)
            if int(i) >= nd:
                sys.exit(f'gguf_edit: {name} has {nd} dimensions')
            struct.pack_into('<Q', buf, at + 4 + 8 * int(i), int(v))
        elif what == 'u32':
            key, v = arg.split(':')
            at = buf.find(struct.pack('<Q', len(key)) + key.encode())
            if at < 0:
                sys.exit(f'gguf_edit: no key {key}')
            # key, then type u32 (4: uint32), then the value
            tat = at + 8 + len(key)
            t, = struct.unpack_from('<I', buf, tat)
            if t != 4:
                sys.exit(f'gguf_edit: {key} is not a u32')
            struct.pack_into('<I', buf, tat + 4, int(v))
        else:
            sys.exit(f'gguf_edit: unknown edit {e}')
    open(dst, 'wb').write(buf)


main()
