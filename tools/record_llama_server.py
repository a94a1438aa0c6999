#!/usr/bin/python3
"""Records real answers of a running llama-server as JSON fixtures, one file per exchange.

Each file holds {"request": {"method", "path"[, "body"]}, "status", "content_type", "body"},
the body parsed as JSON when the server sent JSON, else the text verbatim (e.g. /metrics).
Nothing is rewritten: ids, timestamps and timings are as the server sent them.

Usage: /usr/bin/python3 tools/record_llama_server.py --url http://127.0.0.1:18081 \\
           --out tests/fixtures/servers/llama-server/recorded --prefix a [--only props,slots,...]
Needs only python3 (urllib); start the servers with tools/llama-server-pair.sh.
"""
import argparse
import json
import os
import urllib.error
import urllib.request

PROMPT = "def add(a, b):\n    return"
SNIPPET = "def add(a, b):"


def exchange(url, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, ctype, raw = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("Content-Type", ""), e.read()
    text = raw.decode("utf-8")
    try:
        parsed = json.loads(text) if "json" in ctype else text
    except ValueError:
        parsed = text
    request = {"method": method, "path": path}
    if body is not None:
        request["body"] = body
    return {"request": request, "status": status, "content_type": ctype, "body": parsed}


def plan(url):
    """(name, method, path, body or callable(previous results) -> body), in recording order."""
    sampling = {"max_tokens": 8, "temperature": 0, "seed": 42}
    return [
        ("get-health", "GET", "/health", None),
        ("get-v1-models", "GET", "/v1/models", None),
        ("get-props", "GET", "/props", None),
        ("post-tokenize", "POST", "/tokenize", {"content": SNIPPET}),
        ("post-tokenize-with-pieces", "POST", "/tokenize", {"content": SNIPPET, "with_pieces": True}),
        ("post-tokenize-prompt-key", "POST", "/tokenize", {"prompt": SNIPPET}),
        ("post-tokenize-prompt", "POST", "/tokenize", {"content": PROMPT}),
        ("post-detokenize", "POST", "/detokenize",
         lambda done: {"tokens": done["post-tokenize"]["body"]["tokens"]}),
        ("post-v1-completions-logprobs", "POST", "/v1/completions",
         {"prompt": PROMPT, **sampling, "logprobs": 5}),
        ("post-v1-completions-echo", "POST", "/v1/completions",
         {"prompt": PROMPT, **sampling, "logprobs": 5, "echo": True}),
        ("post-v1-completions-token-ids", "POST", "/v1/completions",
         lambda done: {"prompt": done["post-tokenize-prompt"]["body"]["tokens"], **sampling,
                       "logprobs": 5}),
        ("post-v1-completions-no-prompt-cache", "POST", "/v1/completions",
         {"prompt": PROMPT, **sampling, "logprobs": 5, "cache_prompt": False}),
        ("post-v1-completions-max-tokens-0", "POST", "/v1/completions",
         {"prompt": PROMPT, "max_tokens": 0, "temperature": 0, "seed": 42, "logprobs": 5}),
        ("post-v1-chat-completions", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": PROMPT}], **sampling, "logprobs": True,
          "top_logprobs": 5}),
        ("post-completion", "POST", "/completion",
         {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "seed": 42, "n_probs": 5}),
        ("error-v1-completions-prompt-number", "POST", "/v1/completions",
         {"prompt": 5, **sampling}),
        ("error-get-nonexistent", "GET", "/nonexistent", None),
        ("get-slots", "GET", "/slots", None),
        ("get-metrics", "GET", "/metrics", None),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefix", required=True, help="file name prefix, e.g. a or b")
    parser.add_argument("--only", help="comma-separated exchange names to write (all are run)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    done = {}
    for name, method, path, body in plan(args.url.rstrip("/")):
        if callable(body):
            body = body(done)
        done[name] = exchange(args.url.rstrip("/"), method, path, body)
        if only is None or name in only:
            path_out = os.path.join(args.out, f"{args.prefix}-{name}.json")
            with open(path_out, "w", encoding="utf-8") as f:
                json.dump(done[name], f, indent=2, ensure_ascii=False)
                f.write("\n")
            print(f"{done[name]['status']} {method} {path} -> {path_out}")


if __name__ == "__main__":
    main()
