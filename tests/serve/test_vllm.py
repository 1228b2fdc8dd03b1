"""--engine vllm: the vLLM command line built from a plan, and the message when vLLM is missing.

vLLM needs a GPU and is not installed here; the end-to-end test runs a stand-in named as such: a
``vllm.entrypoints.openai.api_server`` module that only prints what it was started with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from kubetune.errors import SpecError
from kubetune.serve.deploy import lora_rank_option
from kubetune.serve.options import ServeOptions
from kubetune.serve.sources import resolve_sources
from kubetune.serve.vllm import vllm_command, vllm_env, vllm_installed


def test_command_serves_base_and_every_adapter_with_lora_enabled(artifacts):
    plan = resolve_sources(str(artifacts.run), {"beta": str(artifacts.beta)})
    cmd = vllm_command(plan, ServeOptions(port=9001, api_key="secret", max_model_len=1024), python="python3")
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args = cmd[3:]

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--model") == str(artifacts.base)
    assert value("--served-model-name") == "tiny-chat"
    assert value("--host") == "127.0.0.1" and value("--port") == "9001"
    assert value("--max-model-len") == "1024"
    assert "--enable-lora" in args and value("--max-loras") == "2" and value("--max-lora-rank") == "8"
    i = args.index("--lora-modules")
    assert args[i + 1 : i + 3] == [f"capitals-bot={artifacts.run / 'adapter'}", f"beta={artifacts.beta}"]
    assert "secret" not in " ".join(cmd), "the API key never appears in argv"
    assert vllm_env(ServeOptions(api_key="secret"), {})["VLLM_API_KEY"] == "secret"


def test_plain_model_needs_no_lora_options(artifacts):
    cmd = vllm_command(resolve_sources("builtin://tiny-chat"), ServeOptions(extra_vllm_args=("--gpu-memory-utilization", "0.8")))
    assert "--enable-lora" not in cmd and "--lora-modules" not in cmd
    assert cmd[-2:] == ["--gpu-memory-utilization", "0.8"]


_HERMES_TEMPLATE = (  # the tool part of Qwen2.5's chat template, shortened
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>\n"
    "For each function call, return a json object within <tool_call></tool_call> XML tags<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}"
)


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_vllm_parses_tool_calls_when_the_template_renders_them(artifacts, tmp_path, where):
    """A model whose chat template writes Hermes <tool_call> blocks (Qwen2.5, kubetune's chatml) gets vLLM's tool
    parser, so OpenAI clients get tool_calls from vLLM as from kubetune serve; one without tools gets none."""
    plain = vllm_command(resolve_sources("builtin://tiny-chat"), ServeOptions())
    assert "--tool-call-parser" not in plain and "--enable-auto-tool-choice" not in plain
    model = tmp_path / "model"
    shutil.copytree(artifacts.base, model)
    for f in model.glob("chat_template*.jinja"):
        f.unlink()
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if where == "chat_template.jinja":
        (model / "chat_template.jinja").write_text(_HERMES_TEMPLATE)
    else:
        cfg["chat_template"] = [{"name": "default", "template": _HERMES_TEMPLATE}]
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    cmd = vllm_command(resolve_sources(str(model)), ServeOptions())
    i = cmd.index("--tool-call-parser")
    assert cmd[i + 1] == "hermes" and "--enable-auto-tool-choice" in cmd
    mine = vllm_command(resolve_sources(str(model)), ServeOptions(extra_vllm_args=("--tool-call-parser=llama3_json", "--enable-auto-tool-choice")))
    assert "hermes" not in mine and mine[-2:] == ["--tool-call-parser=llama3_json", "--enable-auto-tool-choice"], "the user's choice wins"


def test_adapters_vllm_cannot_serve_are_refused(artifacts, tmp_path):
    dora = tmp_path / "dora"
    shutil.copytree(artifacts.alpha, dora)
    cfg = json.loads((dora / "adapter_config.json").read_text())
    cfg["use_dora"] = True
    (dora / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="not DoRA"):
        vllm_command(resolve_sources("builtin://tiny-chat", {"d": str(dora)}), ServeOptions())
    saved = tmp_path / "saved"  # trained with method.lora.modules_to_save: vLLM starts, then fails at the first request
    shutil.copytree(artifacts.alpha, saved)
    cfg = json.loads((saved / "adapter_config.json").read_text())
    cfg["modules_to_save"] = ["embed_tokens"]
    (saved / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="embed_tokens") as e:
        vllm_command(resolve_sources("builtin://tiny-chat", {"s": str(saved)}), ServeOptions())
    assert "kubetune merge" in e.value.hint
    run = tmp_path / "run"  # a run directory with output.merge: true (the quickstart) has the model vLLM takes
    shutil.copytree(saved, run / "adapter")
    (run / "merged").mkdir()
    (run / "merged" / "config.json").write_text("{}")
    with pytest.raises(SpecError, match="embed_tokens") as e:
        vllm_command(resolve_sources("builtin://tiny-chat", {"s": str(run / "adapter")}), ServeOptions())
    assert e.value.hint == f"serve its merged model: kubetune serve {run / 'merged'} --engine vllm"


def test_lora_rank_rounds_up_to_what_vllm_accepts():
    assert [lora_rank_option(r) for r in (1, 8, 9, 16, 24, 300, 512)] == [8, 8, 16, 16, 32, 320, 512]
    with pytest.raises(SpecError, match="largest"):
        lora_rank_option(1024)


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")
def test_missing_vllm_is_a_clear_error(kubetune_cli):
    r = subprocess.run([*kubetune_cli, "serve", "builtin://tiny-chat", "--engine", "vllm"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "vLLM is not installed" in r.stderr and "pip install vllm" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_engine_vllm_starts_vllm_with_the_plan(artifacts, kubetune_cli, tmp_path):
    """`kubetune serve RUN --engine vllm` replaces itself with vLLM's server (a stand-in that prints its argv)."""
    fake = tmp_path / "fake-vllm"
    entry = fake / "vllm" / "entrypoints" / "openai"
    entry.mkdir(parents=True)
    for d in (fake / "vllm", fake / "vllm" / "entrypoints", entry):
        (d / "__init__.py").write_text("")
    (entry / "api_server.py").write_text(
        "import json, os, sys\nprint('FAKE-VLLM ' + json.dumps({'argv': sys.argv[1:], 'key': os.environ.get('VLLM_API_KEY')}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [*kubetune_cli, "serve", str(artifacts.run), "--engine", "vllm", "--port", "8123", "--api-key", "k1", "--adapter", f"beta={artifacts.beta}"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if line.startswith("FAKE-VLLM "))
    seen = json.loads(line.removeprefix("FAKE-VLLM "))
    assert seen["key"] == "k1"
    argv = seen["argv"]
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--lora-modules") + 1] == f"capitals-bot={artifacts.run / 'adapter'}"


def test_admission_limits_with_engine_vllm_are_named_as_not_applied(artifacts, kubetune_cli, tmp_path):
    """The limits of `kubetune serve` belong to the transformers engine: with --engine vllm a warning says so."""
    fake = tmp_path / "fake-vllm"
    entry = fake / "vllm" / "entrypoints" / "openai"
    entry.mkdir(parents=True)
    for d in (fake / "vllm", fake / "vllm" / "entrypoints", entry):
        (d / "__init__.py").write_text("")
    (entry / "api_server.py").write_text("print('FAKE-VLLM')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([*kubetune_cli, "serve", str(artifacts.base), "--engine", "vllm", "--max-n", "4", "--max-queued-tokens", "9999"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "warning: --max-n, --max-queued-tokens apply to the transformers engine" in r.stderr
    r = subprocess.run([*kubetune_cli, "serve", str(artifacts.base), "--engine", "vllm"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
