"""genai-perf, aiperf and lm-eval-harness, unchanged, against the OpenAI frontend of the real server of the
embedded default model: each runs only where it is installed (none is a dependency; scratch virtual
environments outside the repository, see docs/design.md "OpenAI endpoint: load and eval tools"), found on
PATH or in the folders of DASC_TOOLS_PATH (os.pathsep-separated); otherwise the test skips and says why.

- genai-perf (0.0.16, its OpenAI service kind through perf_analyzer 2.47's binary: PA_LD_LIBRARY_PATH
  names the folder with its libb64.so.0d / libcudart.so.12), completions and chat, streaming;
- aiperf (0.13), completions and chat, streaming, counting tokens from our usage (--use-server-token-count)
  with ignore_eos: every request's output length is exactly the one asked for;
- lm_eval --model local-completions on two local tasks (multiple_choice = loglikelihood requests with
  echo + logprobs; generate_until), whose logged log-likelihoods equal transformers' forward on the same
  token ids (lm-eval's own tokenization: no BOS, continuation = whole[len(context):]).
Each tool takes tens of seconds to start on 2 cores; request counts are the smallest that exercise it."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest
import torch

from test_openai_frontend import ASSET, stack  # noqa: F401  (the module's frontend fixture)

NAME = "tiny-kimi-linear"
MC = [("The sun rises in the", ["east", "west"]), ("A week has seven", ["days", "years"]),
      ("The opposite of hot is", ["cold", "blue"])]
GEN = ["Q: What is two plus two?\nA:", "Q: What color is the sky?\nA:"]


def tool(name: str) -> str:
    where = os.environ.get("DASC_TOOLS_PATH", "")
    path = shutil.which(name, path=os.pathsep.join([where, os.environ.get("PATH", "")]) if where else None)
    if path is None:
        pytest.skip(f"{name} is not installed (put it on PATH or in DASC_TOOLS_PATH)")
    return path


def server_frontend(request):
    """The frontend of the shared server, started only once a tool is found (a skip costs no server)."""
    if isinstance(request, tuple):      # (server, frontend) given directly
        return request[1]
    return request.getfixturevalue("stack")[1]


def run(cmd: list[str], cwd, env_extra: dict | None = None, timeout: int = 600) -> str:
    env = {**os.environ, **(env_extra or {})}
    # the tools' own processes: no CUDA, no downloads
    env.pop("TRITON_INTERPRET", None)
    # and their own venvs' packages only (the tests' PYTHONPATH names this checkout)
    env.pop("PYTHONPATH", None)
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    return out


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_genai_perf_openai_modes(request, tmp_path, endpoint):
    exe = tool("genai-perf")
    pa = shutil.which("perf_analyzer", path=os.path.dirname(exe))
    libs = os.environ.get("PA_LD_LIBRARY_PATH", "")
    if pa is None or subprocess.run([pa, "--version"], capture_output=True,
                                    env={**os.environ, "LD_LIBRARY_PATH": libs}).returncode != 0:
        pytest.skip("genai-perf needs a working perf_analyzer binary beside it (tritonclient 2.47.0, "
                    "PA_LD_LIBRARY_PATH for its libraries)")
    front = server_frontend(request)
    env = {"LD_LIBRARY_PATH": libs, "PATH": os.path.dirname(exe) + os.pathsep + os.environ["PATH"],
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run([exe, "profile", "-m", NAME, "--endpoint-type", endpoint, "--streaming", "--url", f"127.0.0.1:{front.port}",
         "--num-prompts", "4", "--request-count", "4", "--warmup-request-count", "0", "--concurrency", "2",
         "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "4", "--tokenizer", str(ASSET)],
        tmp_path, env)
    (path,) = glob.glob(str(tmp_path / "artifacts" / "*" / "profile_export_genai_perf.json"))
    out = json.load(open(path))
    assert out["request_count"]["avg"] == 4
    assert out["time_to_first_token"]["avg"] > 0 and out["inter_token_latency"]["avg"] > 0
    assert out["input_sequence_length"]["avg"] == 32 and out["output_sequence_length"]["avg"] > 0


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_aiperf_openai_modes(request, tmp_path, endpoint):
    exe = tool("aiperf")
    front = server_frontend(request)
    run([exe, "profile", "--model", NAME, "--url", f"http://127.0.0.1:{front.port}", "--endpoint-type", endpoint,
         "--streaming", "--request-count", "4", "--concurrency", "2", "--synthetic-input-tokens-mean", "32",
         "--output-tokens-mean", "4", "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
         "--tokenizer", str(ASSET), "--ui", "simple", "--artifact-dir", str(tmp_path / "out"),
         "--no-server-metrics", "--no-gpu-telemetry"], tmp_path)
    out = json.load(open(tmp_path / "out" / "profile_export_aiperf.json"))
    assert out["request_count"]["avg"] == 4 and not out.get("error_summary")
    # our usage counts: ignore_eos makes every request generate exactly max_tokens
    osl = out["output_sequence_length"]
    assert osl["min"] == osl["max"] == 4
    assert out["time_to_first_token"]["avg"] > 0


def test_lm_eval_local_completions(request, tmp_path):
    exe = tool("lm_eval")
    front = server_frontend(request)
    with open(tmp_path / "mc.jsonl", "w") as f:
        f.writelines(json.dumps({"question": q, "choices": c, "answer": 0}) + "\n" for q, c in MC)
    with open(tmp_path / "gen.jsonl", "w") as f:
        f.writelines(json.dumps({"question": q, "answer": "x"}) + "\n" for q in GEN)
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: \"{{question}}\"\n"
    (tmp_path / "dasc_tiny_mc.yaml").write_text(
        f"task: dasc_tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "metric_list:\n  - metric: acc\n")
    (tmp_path / "dasc_tiny_gen.yaml").write_text(
        f"task: dasc_tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_target: \" {{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 4\nmetric_list:\n  - metric: exact_match\n")
    run([exe, "--model", "local-completions", "--model_args",
         f"model={NAME},base_url=http://127.0.0.1:{front.port}/v1/completions,tokenizer={ASSET},"
         "num_concurrent=1,max_retries=1", "--tasks", "dasc_tiny_mc,dasc_tiny_gen", "--include_path", str(tmp_path),
         "--output_path", str(tmp_path / "results"), "--log_samples"], tmp_path,
        {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    (results,) = glob.glob(str(tmp_path / "results" / "**" / "results_*.json"), recursive=True)
    res = json.load(open(results))["results"]
    assert 0 <= res["dasc_tiny_mc"]["acc,none"] <= 1 and "exact_match,none" in res["dasc_tiny_gen"]
    (samples,) = glob.glob(str(tmp_path / "results" / "**" / "samples_dasc_tiny_mc_*.jsonl"), recursive=True)
    from transformers import AutoTokenizer, KimiLinearForCausalLM
    tok = AutoTokenizer.from_pretrained(str(ASSET))
    hf = KimiLinearForCausalLM.from_pretrained(str(ASSET), dtype=torch.float32).eval()
    checked = 0
    for line in open(samples):
        s = json.loads(line)
        # arguments: {"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...} (0.4.x)
        args = s["arguments"].values() if isinstance(s["arguments"], dict) else s["arguments"]
        pairs = [(a["arg_0"], a["arg_1"]) if isinstance(a, dict) else tuple(a) for a in args]
        for (context, continuation), resp in zip(pairs, s["resps"]):
            # lm-eval's encoding: no special tokens, the continuation's tokens after the context's
            ctx = tok.encode(context, add_special_tokens=False)
            whole = tok.encode(context + continuation, add_special_tokens=False)
            with torch.no_grad():
                lp = torch.log_softmax(hf(torch.tensor([whole])).logits[0].double(), -1)
            want = float(sum(lp[j - 1, whole[j]] for j in range(len(ctx), len(whole))))
            got = float(resp[0][0])
            # the default engine computes in bfloat16 (tests/serve/test_openai_logprobs.py: TOL)
            assert abs(got - want) <= 0.3, (context, continuation, got, want)
            checked += 1
    assert checked == 2 * len(MC)
