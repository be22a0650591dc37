#!/usr/bin/env python3
"""Writes each fixture family's config.json as the current and the previous major version
of transformers save it, for tests/unit/test_model_config.cpp ("config spellings").

transformers re-serialises a config in its own spelling when a user loads a checkpoint
and saves it again (`save_pretrained`): 5.x writes Qwen3-MoE's expert count as
`num_local_experts`, moves `rope_theta` and `rope_scaling` into `rope_parameters`, and
writes `dtype` for `torch_dtype`; 4.56+ already writes `dtype`. charm must read every one
of these spellings and get the same model. For each directory of tests/fixtures/models
this loads its config.json with the family's config class (`from_dict`, as
`from_pretrained` does) and saves it, writing

    tests/fixtures/configs/<fixture>/transformers-<version>.json

Usage:
    python3 scripts/gen_config_spellings.py            # makes two venvs, runs in each
    python3 scripts/gen_config_spellings.py --here     # only with this interpreter's transformers

The venvs go to $CHARM_CONFIG_VENVS (default /tmp/charm-config-venvs): one with
'transformers<5' and one with 'transformers>=5,<6', from PyPI; configs need no torch.
Deterministic: a second run with the same versions writes identical files.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
OUT = ROOT / "tests" / "fixtures" / "configs"
FIXTURES = ["qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
            "deepseek-v3-tiny-fp8", "glm4-moe-tiny", "kimi-k2-tiny", "minimax-m2-tiny", "mixtral-swa-tiny",
            "qwen2-moe-swa-tiny", "gpt-oss-tiny", "glm-moe-dsa-tiny",
            "qwen3-next-tiny", "qwen3.5-moe-tiny", "deepseek-v32-tiny"]
# model_types transformers does not know, read with the class their checkpoints' remote
# code uses (Kimi K2's auto_map names DeepseekV3Config).
CONFIG_TYPE = {"kimi_k2": "deepseek_v3"}
VERSIONS = {"tf4": "transformers<5", "tf5": "transformers>=5,<6"}
# model_types a major version does not have (transformers 4.57 has no minimax_m2,
# glm_moe_dsa, qwen3_5_moe_text or deepseek_v32: under 4.x those are hub remote code, not
# run here).
ABSENT = {"4": {"minimax_m2", "glm_moe_dsa", "qwen3_5_moe_text", "deepseek_v32"}}


def write_here():
    """Saves every fixture config with the transformers this interpreter imports."""
    import transformers
    from transformers import AutoConfig

    for name in FIXTURES:
        source = json.loads((MODELS / name / "config.json").read_text())
        model_type = CONFIG_TYPE.get(source["model_type"], source["model_type"])
        if model_type in ABSENT.get(transformers.__version__.split(".")[0], set()):
            print(f"skipped {name}: transformers {transformers.__version__} has no {model_type}")
            continue
        config_class = type(AutoConfig.for_model(model_type))
        config = config_class.from_dict(copy.deepcopy(source))
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp)
            text = (Path(tmp) / "config.json").read_text()
        saved = json.loads(text)
        if saved.get("transformers_version") != transformers.__version__:
            sys.exit(f"{name}: saved transformers_version {saved.get('transformers_version')!r}, "
                     f"expected {transformers.__version__!r}")
        out = OUT / name / f"transformers-{transformers.__version__}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)  # as transformers wrote it, byte for byte
        print(f"wrote {out.relative_to(ROOT)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--here", action="store_true", help="use this interpreter's transformers only")
    args = parser.parse_args()
    if args.here:
        write_here()
        return
    venvs = Path(os.environ.get("CHARM_CONFIG_VENVS", "/tmp/charm-config-venvs"))
    for tag, requirement in VERSIONS.items():
        venv = venvs / tag
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True)
        subprocess.run([str(python), __file__, "--here"], check=True)


if __name__ == "__main__":
    main()
