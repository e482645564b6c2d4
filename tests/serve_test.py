#!/usr/bin/env python3
"""`strata serve` through plain HTTP (urllib, http.client), as clients use it.

  api         /health, /v1/models; a greedy text completion is the reference
              engine's greedy text (stories260K, "Once upon a time"); the same
              streamed (server-sent events, a final chunk with the finish
              reason and usage, then [DONE]) gives the same text; chat
              completions whole and streamed agree; a stop string cuts the
              text before it
  errors      malformed JSON, wrong types, no messages, an unknown model (404),
              an unknown endpoint (404), a wrong method (405), a prompt longer
              than the context, a body over 1 MiB (413), a missing or wrong
              API key (401): each an OpenAI-style {"error": {...}} body, and
              the server goes on
  together    four requests at once (-np 4), greedy and sampled with a seed,
              each gives the text it gives alone
  disconnect  a client that goes away mid-stream: its slot is freed (the
              metrics count it cancelled, no slot busy) long before its
              max_tokens would have ended it, and the next request is served
  busy        -np 1 --queue 1: one running, one waiting, the third gets 503
              (the metrics show that state after the refusal); when the
              running one goes, the waiting one is answered
  load        mixed good and bad requests from many threads at once: every
              good one answered, every bad one a 4xx, the server alive
  stop        SIGTERM ends the server with status 0
"""
import http.client, json, os, re, signal, socket, subprocess, sys, threading, time
import urllib.error, urllib.request

strata = os.environ["STRATA_BIN"]
fix = os.environ["STRATA_FIXTURES"]
model = os.path.join(fix, "models/stories260K.gguf")
if not os.path.exists(model):
    print(f"SKIP: no fixtures under {fix}")
    sys.exit(77)
ref = open(os.path.join(fix, "ref/stories260K-once-upon-a-time.txt")).read().rstrip("\n")
failed = 0


def check(ok, what):
    global failed
    print(("ok  " if ok else "FAIL"), what, flush=True)
    failed += not ok


class Server:
    """strata serve on a free port; stderr kept for messages."""

    def __init__(self, *args):
        self.p = subprocess.Popen([strata, "serve", "-m", model, "--port", "0", "-t", "1", *args],
                                  stderr=subprocess.PIPE, text=True)
        self.err = []
        line = self.p.stderr.readline()
        self.err.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            raise RuntimeError("no listening line: " + line + self.p.stderr.read())
        self.port = int(m.group(1))
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + 60
        while time.time() < deadline:
            st, body = self.req("GET", "/health")
            if st == 200 and body.get("status") == "ok":
                return
            time.sleep(0.05)
        raise RuntimeError("the server never became ready")

    def _drain(self):
        for line in self.p.stderr:
            self.err.append(line)

    def req(self, method, path, body=None, headers=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def stream(self, path, body):
        """The events of a streamed request: a list of parsed chunks, then "[DONE]"."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", path, body=json.dumps(dict(body, stream=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events = []
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                d = line[6:]
                events.append(d if d == "[DONE]" else json.loads(d))
        c.close()
        return r.status, r.getheader("Content-Type"), events

    def metrics(self):
        st, text = self.req("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=60)


def is_error(status, body, want_status, code=None):
    return (status == want_status and isinstance(body, dict) and "error" in body and
            isinstance(body["error"].get("message"), str) and "type" in body["error"] and
            (code is None or body["error"].get("code") == code))


def text_of(events, chat):
    key = (lambda ch: ch["delta"].get("content") or "") if chat else (lambda ch: ch["text"])
    return "".join(key(e["choices"][0]) for e in events if e != "[DONE]")


# ---- api, errors, together -------------------------------------------------
s = Server("-np", "4", "-c", "512")
st, body = s.req("GET", "/v1/models")
check(st == 200 and body["data"][0]["id"] == "stories260K.gguf", "models lists the model")
mid = body["data"][0]["id"]

prompt = "Once upon a time"
want = ref[len("<s> " + prompt):] if ref.startswith("<s> " + prompt) else None
st, body = s.req("POST", "/v1/completions",
                 {"model": mid, "prompt": prompt, "max_tokens": 48, "temperature": 0})
text = body["choices"][0]["text"] if st == 200 else None
check(st == 200 and want is not None and text == want,
      f"greedy completion is the reference's text ({text!r})")
check(st == 200 and body["usage"] == {"prompt_tokens": 5, "completion_tokens": 48,
                                      "total_tokens": 53}
      and body["choices"][0]["finish_reason"] == "length", "usage and finish_reason")

st, ctype, ev = s.stream("/v1/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0})
check(st == 200 and ctype.startswith("text/event-stream") and ev and ev[-1] == "[DONE]"
      and text_of(ev, False) == text, "streamed completion: the same text, then [DONE]")
fin = [e for e in ev if e != "[DONE]" and e["choices"][0]["finish_reason"]]
check(len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] == "length"
      and fin[0]["usage"]["completion_tokens"] == 48, "the stream's final chunk: finish and usage")

chat = {"messages": [{"role": "system", "content": "You tell stories."},
                     {"role": "user", "content": "Tell me about Lily."}],
        "max_tokens": 40, "temperature": 0}
st, body = s.req("POST", "/v1/chat/completions", chat)
ctext = body["choices"][0]["message"]["content"] if st == 200 else None
check(st == 200 and body["object"] == "chat.completion" and ctext
      and body["choices"][0]["message"]["role"] == "assistant", f"chat completion ({ctext!r})")
st, ctype, ev = s.stream("/v1/chat/completions", chat)
check(st == 200 and ev[0]["choices"][0]["delta"].get("role") == "assistant"
      and ev[0]["object"] == "chat.completion.chunk" and text_of(ev, True) == ctext
      and ev[-1] == "[DONE]", "streamed chat: role first, the same text, [DONE]")

st, body = s.req("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 48,
                                             "temperature": 0, "stop": ["Lily"]})
check(st == 200 and body["choices"][0]["text"] == want.split("Lily")[0]
      and body["choices"][0]["finish_reason"] == "stop", "a stop string cuts the text before it")
st, ctype, ev = s.stream("/v1/completions", {"prompt": prompt, "max_tokens": 48,
                                             "temperature": 0, "stop": "Lily"})
check(text_of(ev, False) == want.split("Lily")[0], "streamed: the stop string is never sent")

bad = [
    ("malformed JSON", "POST", "/v1/chat/completions", b'{"messages": [', 400, None),
    ("not an object", "POST", "/v1/completions", b'[1, 2]', 400, None),
    ("temperature a string", "POST", "/v1/completions",
     json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, None),
    ("max_tokens a float", "POST", "/v1/completions",
     json.dumps({"prompt": "x", "max_tokens": 1.5}).encode(), 400, None),
    ("stream a string", "POST", "/v1/completions",
     json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, None),
    ("no messages", "POST", "/v1/chat/completions", b'{"model": "stories260K.gguf"}', 400, None),
    ("a bad role", "POST", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, None),
    ("content a number", "POST", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": 7}]}).encode(), 400, None),
    ("an unknown model", "POST", "/v1/chat/completions",
     json.dumps({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}).encode(),
     404, "model_not_found"),
    ("an unknown endpoint", "GET", "/v1/nothing", None, 404, None),
    ("a wrong method", "GET", "/v1/chat/completions", None, 405, None),
    ("a prompt longer than the context", "POST", "/v1/completions",
     json.dumps({"prompt": "Lily went to the park. " * 200}).encode(), 400,
     "context_length_exceeded"),
    ("a body over 1 MiB", "POST", "/v1/completions",
     json.dumps({"prompt": "x" * (1 << 21)}).encode(), 413, None),
]
for what, method, path, raw, code, ecode in bad:
    st, body = s.req(method, path, raw=raw)
    check(is_error(st, body, code, ecode), f"{what}: {code} with an error body ({st})")
st, body = s.req("GET", "/health")
check(st == 200 and body == {"status": "ok"}, "alive after the bad requests")

# alone, then four at once: the same texts
reqs = [{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0},
        {"prompt": "Lily and Ben", "max_tokens": 32, "temperature": 0.8, "seed": 42},
        {"prompt": "The little dog", "max_tokens": 48, "temperature": 0.9, "seed": 7},
        {"prompt": "One day, a bird", "max_tokens": 24, "temperature": 0}]
alone = [s.req("POST", "/v1/completions", r)[1]["choices"][0]["text"] for r in reqs]
for rnd in range(2):
    together = [None] * len(reqs)

    def one(i):
        if i % 2:
            together[i] = text_of(s.stream("/v1/completions", reqs[i])[2], False)
        else:
            together[i] = s.req("POST", "/v1/completions", reqs[i])[1]["choices"][0]["text"]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check(together == alone, f"four at once (round {rnd}): each text as it is alone")
m = s.metrics()
check(m["strata_decode_rows_total"] > m["strata_decode_passes_total"],
      "passes carried several sequences' rows "
      f"({m['strata_decode_rows_total']:.0f} rows in {m['strata_decode_passes_total']:.0f} passes)")
check(s.stop() == 0, "SIGTERM: exit 0")

# ---- the API key -------------------------------------------------------------
s = Server("--api-key", "sekrit")
st, body = s.req("GET", "/v1/models")
check(is_error(st, body, 401, "invalid_api_key"), "no API key: 401")
st, body = s.req("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
check(is_error(st, body, 401, "invalid_api_key"), "a wrong API key: 401")
st, body = s.req("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
check(st == 200, "the right API key: 200")
st, body = s.req("GET", "/health")
check(st == 200, "/health needs no key")
s.stop()

# ---- disconnect, busy --------------------------------------------------------
s = Server("-np", "1", "--queue", "1", "-c", "8192")
long_req = json.dumps({"prompt": "Once upon a time", "max_tokens": 8000, "temperature": 0.8,
                       "seed": 1, "stream": True})


def open_stream():
    """A streaming request whose first event has arrived: it holds the slot."""
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(long_req)}\r\n\r\n{long_req}").encode())
    got = b""
    while b"data: " not in got:
        got += sock.recv(4096)
    return sock


def wait_for(cond, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = s.metrics()
        if cond(m):
            return m
        time.sleep(0.02)
    check(False, what + " (timed out)")
    return s.metrics()


before = s.metrics()
sock = open_stream()
sock.close()
m = wait_for(lambda m: m["strata_requests_total{outcome=\"cancelled\"}"] == 1
             and m["strata_slots_active"] == 0, "a disconnected stream frees its slot")
gen = m["strata_generated_tokens_total"] - before["strata_generated_tokens_total"]
check(m["strata_slots_active"] == 0 and gen < 8000,
      f"disconnect: slot freed after {gen:.0f} of 8000 tokens")
st, body = s.req("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 4})
check(st == 200, "the next request is served")

sock = open_stream()
waiting = {}
t = threading.Thread(target=lambda: waiting.update(r=s.req(
    "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})))
t.start()
wait_for(lambda m: m["strata_queue_length"] == 1, "the second request waits")
st, body = s.req("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4})
m = s.metrics()
check(is_error(st, body, 503, "server_busy") and m["strata_slots_active"] == 1
      and m["strata_queue_length"] == 1, f"one running, one waiting: the third gets 503 ({st})")
sock.close()
t.join(timeout=60)
st, body = waiting.get("r", (None, None))
check(st == 200 and body["choices"][0]["text"] == want[:len(body["choices"][0]["text"])]
      and body["choices"][0]["text"], "the waiting request is answered when the slot frees")
s.stop()

# ---- load --------------------------------------------------------------------
s = Server("-np", "2", "--queue", "64", "-c", "1024")
results = []
lock = threading.Lock()


def worker(i):
    kind = i % 4
    if kind == 0:
        st, body = s.req("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": f"Story {i}"}],
                          "max_tokens": 16, "temperature": 0.5, "seed": i})
        ok = st == 200 and body["choices"][0]["message"]["content"] is not None
    elif kind == 1:
        st, _, ev = s.stream("/v1/completions", {"prompt": f"Once {i}", "max_tokens": 16})
        ok = st == 200 and ev and ev[-1] == "[DONE]"
    elif kind == 2:
        st, body = s.req("POST", "/v1/completions", raw=b'{"prompt": ')
        ok = is_error(st, body, 400)
    else:
        st, body = s.req("POST", "/v1/completions", {"prompt": 5})
        ok = is_error(st, body, 400)
    with lock:
        results.append((kind, ok))


ts = [threading.Thread(target=worker, args=(i,)) for i in range(24)]
[t.start() for t in ts]
[t.join(timeout=120) for t in ts]
check(len(results) == 24 and all(ok for _, ok in results),
      f"load: {sum(ok for _, ok in results)} of 24 mixed requests answered as they should")
st, body = s.req("GET", "/health")
check(st == 200, "alive after the load")
check(s.stop() == 0, "SIGTERM after the load: exit 0")

# ---- text that is no UTF-8 ----------------------------------------------------
# A random-weight model emits byte tokens that make no UTF-8: the JSON must
# still be (each stray byte U+FFFD), whole and streamed.
model = os.path.join(fix, "models/tiny-llama-q4_0.gguf")
s = Server("-np", "2", "-c", "256")
bad_bytes = 0
for seed in range(6):
    req = {"prompt": "Hello", "max_tokens": 48, "temperature": 1.0, "seed": seed}
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(req))
    raw = c.getresponse().read()
    c.close()
    try:
        text = json.loads(raw.decode("utf-8"))["choices"][0]["text"]
        bad_bytes += text.count("\ufffd")
        st, _, ev = s.stream("/v1/completions", req)
        ok = text_of(ev, False) == text
    except (UnicodeDecodeError, ValueError) as e:
        ok = False
        print("   ", e, raw[:200])
    check(ok, f"tiny-llama seed {seed}: valid UTF-8 JSON, streamed the same")
print(f"    ({bad_bytes} stray bytes replaced in all)")
s.stop()

print("FAILED" if failed else "all ok", flush=True)
sys.exit(1 if failed else 0)
