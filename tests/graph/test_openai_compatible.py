"""The agents through LangChain's real OpenAI client against a local OpenAI-compatible server.

The server (loopback only, a handful of requests) answers chat completions with tool calls, the
way vLLM, llama.cpp or SGLang do with function calling; the client, its structured-output parsing
and the CLI's ``--base-url`` path all run for real.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stitch_graph.cli import main
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.test_routing import HOST, KERNEL, PROBLEM

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")

PLAN = {
    "summary": "one fused kernel",
    "items": [
        {"kernel": "add_relu", "ops": ["add", "relu"], "fusion": "one pass", "kind": "pointwise"}
    ],
}
PROGRAM = {"kernel_source": KERNEL, "host_source": HOST, "declared_torch_ops": []}


class _Server(ThreadingHTTPServer):
    requests: list[dict]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        offered = [t["function"]["name"] for t in body.get("tools", [])]
        name = "PlanDraft" if "PlanDraft" in offered else "CandidateDraft"
        arguments = json.dumps(PLAN if name == "PlanDraft" else PROGRAM)
        answer = {
            "id": f"chatcmpl-{len(self.server.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{len(self.server.requests)}",
                                "type": "function",
                                "function": {"name": name, "arguments": arguments},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_cli_with_a_local_openai_compatible_server(server, tmp_path, monkeypatch):
    problem = tmp_path / "add_relu.py"
    problem.write_text(PROBLEM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    code = main(
        [
            "optimize",
            str(problem),
            "--model",
            "openai:local-coder",
            "--base-url",
            url,
            "--verifier-model",
            "rules",
            "--out",
            "runs/local",
            "--no-knowledge",
            "--quiet",
        ]
    )
    report = json.loads((tmp_path / "runs/local/report.json").read_text())
    assert code == 0
    # without a GPU the program is compiled, never claimed correct
    assert report["outcome"] in ("compiled_only", "verified")
    assert (tmp_path / "runs/local/program.cu").read_text() == KERNEL
    models = {r["model"] for r in server.requests}
    assert models == {"local-coder"}
    # structured output went through function calling: the schema was offered as a tool
    offered = [t["function"]["name"] for r in server.requests for t in r.get("tools", [])]
    assert "PlanDraft" in offered and "CandidateDraft" in offered and "nvcc_compile" in offered
