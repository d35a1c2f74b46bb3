"""`smoke --server URL`: the completions API and the Prometheus counters of a running server (loopback)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eaglectl.commands.smoke.server import parse_metrics

from .conftest import FIXTURES, free_port, vllm_server

TRAINED = FIXTURES / "trained"
TARGET = TRAINED / "target"


class _FakeVllm(BaseHTTPRequestHandler):
    """What a vLLM server answers: each completion adds one draft of k=3 with 2 accepted per call."""

    counts = {"drafts": 7.0, "accepted": 5.0, "pos": [3.0, 2.0, 0.0]}  # earlier traffic: must not count
    spec = True

    def log_message(self, *a):
        pass

    def _send(self, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        c = self.counts
        if self.path == "/v1/models":
            self._send({"data": [{"id": "served-target"}]})
        elif self.path == "/version":
            self._send({"version": "0.32.0"})
        elif self.path == "/metrics":
            lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
                     "# TYPE vllm:spec_decode_num_drafts counter"]
            if self.spec:
                lines += [f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {c["drafts"]}',
                          f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {3 * c["drafts"]}',
                          f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {c["accepted"]}']
                lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",'
                          f'position="{i}"}} {v}' for i, v in enumerate(c["pos"])]
            lines.append('vllm:num_requests_running{engine="0"} 0.0')
            self._send("\n".join(lines) + "\n", "text/plain")
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and body["model"] == "served-target" and body["temperature"] == 0.0
        c = self.counts
        c["drafts"] += 1
        c["accepted"] += 2
        c["pos"][0] += 1
        c["pos"][1] += 1
        self._send({"choices": [{"text": "x", "token_ids": list(range(body["max_tokens"]))}]})


@pytest.fixture
def fake_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    _FakeVllm.counts = {"drafts": 7.0, "accepted": 5.0, "pos": [3.0, 2.0, 0.0]}
    _FakeVllm.spec = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_counts_are_deltas_around_the_run(invoke, fake_server):
    r = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--server", fake_server, "--num-prompts", "4",
               "--max-tokens", "8", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["engine"] == "server" and doc["versions"]["vllm_version"] == "0.32.0"
    assert doc["num_drafts"] == 4 and doc["num_accepted_tokens"] == 8  # 4 requests, not the earlier traffic
    assert doc["num_draft_tokens"] == 12
    assert doc["mean_acceptance_length"] == pytest.approx(3.0)
    assert doc["per_position_acceptance"][:3] == pytest.approx([1.0, 1.0, 0.0])


def test_a_server_without_a_drafter_is_a_one_line_failure(invoke, fake_server):
    _FakeVllm.spec = False
    r = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--server", fake_server, "--num-prompts", "2")
    assert r.exit_code == 9 and "runs no drafter" in r.output and "Traceback" not in r.output


def test_an_unreachable_server_names_the_url(invoke):
    url = f"http://127.0.0.1:{free_port()}"
    r = invoke("smoke", TRAINED / "eagle3.1", "--target", TARGET, "--server", url, "--num-prompts", "2")
    assert r.exit_code == 22 and url in r.output and "connection refused" in r.output


def test_parse_metrics_sums_label_sets_and_orders_positions():
    text = ('vllm:spec_decode_num_drafts_total{engine="0"} 2\nvllm:spec_decode_num_drafts_total{engine="1"} 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5\n')
    got = parse_metrics(text)
    assert got["num_drafts"] == 5 and got["accepted_per_pos"] == [5, 4]
    assert parse_metrics("vllm:num_requests_running 0\n") is None


@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_vllm_server_counts_like_the_reference_loop(tmp_path, invoke, vllm_py, vllm_default_processes):
    python = vllm_py
    drafter = str(Path(TRAINED / "eagle3.1").resolve())  # vLLM needs absolute local paths
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    serve = ["--model", str(TARGET.resolve()), "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
             "--seed", "0", "--speculative-config", json.dumps(spec)]
    args = ["smoke", drafter, "--target", TARGET, "--num-prompts", "4", "--max-tokens", "32", "--json"]
    with vllm_server(python, serve, tmp_path) as (port, log):
        r = invoke(*args, "--server", f"http://127.0.0.1:{port}", "--timeout-s", "600")
        assert r.exit_code == 0, r.output + log.read_text()[-3000:]
    ref = invoke(*args, "--engine", "reference")
    got, want = json.loads(r.stdout), json.loads(ref.stdout)
    for key in ("num_drafts", "num_accepted_tokens", "mean_acceptance_length", "per_position_acceptance"):
        assert got[key] == want[key], (key, got[key], want[key])
