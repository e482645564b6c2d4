#!/usr/bin/env python3
"""make_seeds.py FIXTURES OUT - the seed corpora of the fuzzing harnesses
(tests/fuzz/), from the shared fixtures, into OUT/<harness>/.

  fuzz_gguf      fixture models cut where their tensor data starts (the
                 header, metadata and tensor table: where a file's structure
                 lives; the harness supplies zeros for the data): the
                 smallest (SentencePiece vocabulary, f32), one with K-quants
                 and one of another architecture
  fuzz_tokenize  one byte choosing a vocabulary (the order of VOCABS in
                 fuzz_tokenize.c), then the text of its .inp fixture
  fuzz_vocab     small vocabularies in the harness's own format (see
                 fuzz_vocab.c) and texts
  fuzz_proto_server, fuzz_proto_client
                 every message each side receives, well formed, as proto_i.h
                 lays them out, and a whole session, each datagram framed by
                 its u16 length (and the client's after a session's sizes)

Deterministic: the same fixtures give the same files.  The committed corpus
(tests/fuzz/corpus/) was made with this, and grows by what the harnesses find.
"""
import os
import struct
import sys

GGUF_SEEDS = ['stories260K.gguf', 'tiny-llama-q4_k_m.gguf', 'tiny-gemma2-q4_k_m.gguf']


def data_offset(buf):
    """Where a GGUF image's tensor data starts (its header parsed)."""
    pos = 24
    magic, ver, n_t, n_kv = struct.unpack_from('<IIQQ', buf, 0)
    assert magic == 0x46554747 and ver in (2, 3)
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32

    def string(p):
        n, = struct.unpack_from('<Q', buf, p)
        return p + 8 + n, bytes(buf[p + 8:p + 8 + n])

    def value(p, t):
        if t in fixed:
            return p + fixed[t], buf[p:p + fixed[t]]
        if t == 8:
            return string(p)
        et, n = struct.unpack_from('<IQ', buf, p)
        p += 12
        for _ in range(n):
            p, _ = value(p, et)
        return p, None

    for _ in range(n_kv):
        pos, key = string(pos)
        t, = struct.unpack_from('<I', buf, pos)
        pos, v = value(pos + 4, t)
        if key == b'general.alignment':
            align, = struct.unpack('<I', v)
    for _ in range(n_t):
        pos, _ = string(pos)
        nd, = struct.unpack_from('<I', buf, pos)
        pos += 4 + 8 * nd + 4 + 8
    return (pos + align - 1) // align * align


def proto_version():
    """PROTO_VERSION as pager/proto_i.h defines it."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'pager',
                           'proto_i.h')) as f:
        return int(next(l.split()[2] for l in f if l.startswith('#define PROTO_VERSION ')))


def hdr(t, n):
    return struct.pack('<IHHII', 0x41525453, proto_version(), t, n, 0)


def msg(t, payload=b''):
    return hdr(t, len(payload)) + payload


def framed(m):
    """one datagram as the protocol harnesses read them: u16 length, bytes"""
    return struct.pack('<H', len(m)) + m


def write(out, harness, name, data):
    d = os.path.join(out, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def main():
    fix, out = sys.argv[1:]
    for sub in ('models', 'arch/models'):
        d = os.path.join(fix, sub)
        for m in sorted(os.listdir(d)):
            if m not in GGUF_SEEDS:
                continue
            with open(os.path.join(d, m), 'rb') as f:
                head = f.read(8 << 20)
            try:
                end = data_offset(head)
            except (struct.error, AssertionError):
                continue
            write(out, 'fuzz_gguf', m.replace('.gguf', '.head'), head[:end])

    # the order of VOCABS in fuzz_tokenize.c
    vocabs = ['llama-spm', 'gpt-2', 'phi-3', 'deepseek-coder', 'falcon', 'starcoder',
              'mpt', 'refact', 'deepseek-llm']
    for i, v in enumerate(vocabs):
        inp = os.path.join(fix, 'vocab', f'ggml-vocab-{v}.gguf.inp')
        if os.path.exists(inp):
            text = open(inp, 'rb').read()
            # the .inp files hold tests separated by a marker line
            for k, part in enumerate(text.split(b'\n__ggml_vocab_test__\n')[:12]):
                write(out, 'fuzz_tokenize', f'{v}-{k}', bytes([i]) + part)

    # fuzz_vocab: flags byte, tokens separated by \n, \0, text (fuzz_vocab.c)
    spm = b'\n'.join([b'<unk>', b'<s>', b'</s>'] + [b'<0x%02X>' % i for i in range(0, 256, 17)] +
                     [b'\xe2\x96\x81the', b'\xe2\x96\x81a', b'th', b'e', b'a', b'\xe2\x96\x81'])
    write(out, 'fuzz_vocab', 'spm', b'\x00' + spm + b'\0' + b'the a thea \xff\xfe z')
    bpe = b'\n'.join([b'a', b'b', b'ab', b'\xc4\xa0', b'\xc4\xa0a', b'<|endoftext|>', b'c'])
    for pre in range(4):
        write(out, 'fuzz_vocab', f'bpe{pre}', bytes([1 | pre << 1]) + bpe + b'\0' +
              b'ab a b c <|endoftext|> 123 \xf0\x9f\x98\x80')

    name = b'stories260K.gguf'
    server = {
        'hello': msg(1, struct.pack('<IIQ', 1, len(name), 1 << 20) + name),
        'hello-control': msg(1, struct.pack('<IIQ', 2, 0, 0)),
        'register': msg(3, struct.pack('<QQ', 0x7f0000000000, 1 << 20)),
        'status-req': msg(5, struct.pack('<I', 1)),
        'declare': msg(8, struct.pack('<QQ', 64 << 20, 32 << 20)),
        'remapped': msg(11, struct.pack('<I', 7)),
        'pass': msg(12, struct.pack('<IIQIIII', 3, 4, 123456, 10, 3, 3, 0) +
                    struct.pack('<4I', 1, 2, 3, 4)),
        'route': msg(13, struct.pack('<II', 5, 3) + struct.pack('<3I', 2, 17, 90)),
        'hint': msg(14, struct.pack('<II', 6, 2) + struct.pack('<2I', 17, 4)),
    }
    for k, v in server.items():
        write(out, 'fuzz_proto_server', k, framed(v))
    # a whole session, as the daemon receives it
    write(out, 'fuzz_proto_server', 'session',
          b''.join(framed(server[k]) for k in ('hello', 'register', 'declare', 'route', 'hint', 'pass',
                                              'remapped')))
    client = {
        'model': msg(2, struct.pack('<QQIIQQQQII', 1185376, 1187840, 7, 4096, 0, 8 << 20,
                                    1 << 30, 2 << 30, 1, 0)),
        'slots': msg(9),
        'ready': msg(4, struct.pack('<II', 3, 0)),
        'status': msg(6, b'{"models": []}'),
        'error': msg(7, struct.pack('<I', 5) + b'the model file could not be read'),
        'remap': msg(10, struct.pack('<II', 9, 2) + struct.pack('<QQQ', 0, 8192, 4096) +
                     struct.pack('<QQQ', 8192, 4096, 0xffffffffffffffff)),
    }
    # the session: map_size, slots_size, page size (fuzz_proto_client.c)
    session = struct.pack('<QQQ', 1187840, 8 << 20, 4096)
    for k, v in client.items():
        write(out, 'fuzz_proto_client', k, session + framed(v))
    write(out, 'fuzz_proto_client', 'session',
          session + b''.join(framed(client[k]) for k in ('model', 'slots', 'ready', 'remap', 'error')))


if __name__ == '__main__':
    main()
