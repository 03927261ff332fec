"""The export YAML: round trip of a full export, minimal hand-written files, and errors that name the
file, the key and what was expected."""
from __future__ import annotations

import pytest
import yaml

from autoopt.targets.builtin.config_file import LoadedConfig, load_config_file, write_export
from autoopt.errors import UserError


def _export_doc() -> dict:
    return {
        "target": "builtin", "preset": "tiny",
        "knobs": {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual", "attn_block_kv": 32},
        "layers": {2: {"indexer_gemm": "bf16"}, 3: {"mhc_gemm": "fp32"}},
        "space": {"name": "dsv4-default"},
        "environment": {"gpu_name": None, "torch": "2.13.0"},
        "evidence": {"trial": 7, "tok_per_s": {"1": {"median": 812.0, "ci_low": 800.0, "ci_high": 820.0}}},
        "autoopt_version": "0.1.0",
    }


def test_full_export_round_trips(tmp_path):
    (tmp_path / "out").mkdir()
    path = write_export(tmp_path / "out" / "config.yaml", _export_doc())
    text = path.read_text()
    assert text.startswith("autoopt_export: 1\n")  # the marker first, so a person sees what it is
    assert "!!python" not in text  # plain YAML only
    loaded = load_config_file(path)
    assert isinstance(loaded, LoadedConfig)
    assert (loaded.target, loaded.preset) == ("builtin", "tiny")
    assert loaded.knobs == {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual", "attn_block_kv": 32}
    assert loaded.layer_overrides == [[2, "indexer_gemm", "bf16"], [3, "mhc_gemm", "fp32"]]
    assert loaded.raw["evidence"]["trial"] == 7
    assert loaded.config()["layer_overrides"] == loaded.layer_overrides


def test_write_export_accepts_tuples_and_keeps_order(tmp_path):
    doc = _export_doc()
    doc["space"] = {"values": ("a", "b")}
    doc["custom"] = {"x": 1}
    path = write_export(tmp_path / "c.yaml", doc)
    keys = list(yaml.safe_load(path.read_text()))
    assert keys[:4] == ["autoopt_export", "target", "preset", "knobs"]
    assert keys[-1] == "custom"


def test_minimal_hand_written_file_with_values_as_text_and_layer_class(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("preset: tiny\nknobs:\n  attn_block_kv: '64'\n  glue: eager\n"
                 "layers:\n  c4:\n    mhc_gemm: bf16\n")
    loaded = load_config_file(p)
    assert loaded.target == "builtin"
    assert loaded.knobs == {"attn_block_kv": 64, "glue": "eager"}  # coerced to the knob's own type
    import dsv4

    c4_layers = dsv4.preset("tiny").layers_of_class("c4")
    assert c4_layers and loaded.layer_overrides == [[i, "mhc_gemm", "bf16"] for i in c4_layers]


def test_layer_class_knob_written_layer_by_layer_as_best_export_writes_it(tmp_path):
    """`autoopt best --export` writes every override per layer index; a knob that allows only the
    global and layer_class scopes (attn_block_kv) then appears per layer. Found on the H200: the
    exported best did not load. Each class's layers must agree, and the file says which do not."""
    import dsv4

    cfg = dsv4.preset("tiny")
    c128 = cfg.layers_of_class("c128")
    assert len(c128) >= 2
    per_layer = {i: {"attn_block_kv": 32 if cfg.layer_class(i) == "c128" else 64} for i in range(cfg.n_layers)}
    p = tmp_path / "exported.yaml"
    p.write_text(yaml.safe_dump({"preset": "tiny", "knobs": {"attn_block_kv": 64}, "layers": per_layer}))
    loaded = load_config_file(p)
    assert [o for o in loaded.layer_overrides if o[2] == 32] == [[i, "attn_block_kv", 32] for i in c128]
    per_layer[c128[0]] = {"attn_block_kv": 128}  # one c128 layer disagrees with the other
    p.write_text(yaml.safe_dump({"preset": "tiny", "knobs": {"attn_block_kv": 64}, "layers": per_layer}))
    with pytest.raises(UserError, match="attn_block_kv is set per layer class, so the c128 layers"):
        load_config_file(p)

def test_shape_overrides_are_read(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("preset: tiny\nshape: {hidden: 512}\nknobs: {}\n")
    assert load_config_file(p).shape == {"hidden": 512}


@pytest.mark.parametrize("body, must_say", [
    ("preset: tiny\nknobs: {no_such_knob: 1}\n", ["knobs.no_such_knob", "unknown knob", "mhc_gemm"]),
    ("preset: tiny\nknobs: {mhc_gemm: fp64}\n", ["knobs.mhc_gemm", "fp32, bf16"]),
    ("preset: huge\n", ["preset", "tiny", "huge"]),
    ("preset: tiny\nlayers: {99: {mhc_gemm: bf16}}\n", ["layers.99", "0..3"]),
    ("preset: tiny\nlayers: {top: {mhc_gemm: bf16}}\n", ["layers.top", "layer index", "c4"]),
    ("preset: tiny\nlayers: {2: {glue: compile}}\n", ["layers.2.glue", "global"]),
    ("preset: tiny\nlayers: {c4: {attention: mma}, 2: {mhc_gemm: half}}\n", ["layers.2.mhc_gemm", "expected one of"]),
    ("preset: tiny\nknobs: [a, b]\n", ["knobs", "expected a mapping"]),
    ("- just\n- a list\n", ["expected a mapping"]),
    ("preset: tiny\nknob: {}\n", ["unknown top-level key 'knob'"]),
    ("autoopt_export: 2\npreset: tiny\n", ["autoopt_export", "expected 1"]),
    ("target: command\npreset: tiny\n", ["target", "builtin"]),
    ("preset: tiny\nshape: {widthh: 3}\n", ["shape", "widthh", "hidden"]),
    ("preset: tiny\nknobs: {mhc_gemm: [unclosed\n", ["not valid YAML"]),
])
def test_errors_name_file_key_and_expectation(tmp_path, body, must_say):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(UserError) as info:
        load_config_file(p)
    msg = str(info.value)
    assert msg.startswith(str(p)), msg
    for fragment in must_say:
        assert fragment in msg, (fragment, msg)
    assert "\n" not in msg  # one line for the CLI


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read config file"):
        load_config_file(tmp_path / "nope.yaml")


def test_an_export_with_bests_warnings_loads(tmp_path):
    """`autoopt best --export` writes what it warned about beside the winner (a confirmation that
    disagreed, ...); the file must still load (on the H200 `h200_decode.py --best` refused it)."""
    doc = _export_doc() | {"warnings": ["the confirmation #17 measured -6.6% against #3"]}
    loaded = load_config_file(write_export(tmp_path / "config.yaml", doc))
    assert loaded.raw["warnings"] == doc["warnings"] and loaded.knobs["mhc_gemm"] == "bf16"
