"""Search spaces: YAML parsing with line-numbered errors, scopes -> parameters -> target configs,
constraints parsed with ast (never eval), the shipped spaces, and `autoopt spaces`."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoopt.errors import SpaceError
from autoopt.space.space import SearchSpace
from autoopt.targets.builtin.declared import builtin_info
from autoopt.targets.declared import load_declared
from autoopt.space.constraints import ConstraintSyntaxError, parse_constraint

REPO = Path(__file__).resolve().parents[1]
HEADER = """\
name: t
target: builtin
preset: tiny
device: cpu
concurrency: [1, 4]
objective: {concurrency: 4}
"""


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(header + textwrap.dedent(body))
    return p


def load(tmp_path: Path, body: str, header: str = HEADER) -> SearchSpace:
    return load_declared(write(tmp_path, body, header))


def error_of(tmp_path: Path, body: str, header: str = HEADER) -> str:
    with pytest.raises(SpaceError) as exc:
        load(tmp_path, body, header)
    return str(exc.value)


# ---- constraints ---------------------------------------------------------------------------------
def test_constraint_semantics():
    c = parse_constraint("mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'", {"mhc_operand", "mhc_gemm"})
    assert c.names == {"mhc_operand", "mhc_gemm"}
    assert c.holds({"mhc_operand": "cast_from_fp32", "mhc_gemm": "fp32"})
    assert c.holds({"mhc_operand": "view_bf16_residual", "mhc_gemm": "bf16"})
    assert not c.holds({"mhc_operand": "view_bf16_residual", "mhc_gemm": "fp32"})
    env = {"a": 4, "b": "x"}
    assert parse_constraint("a in (2, 4) and b not in ['y', 'z']").holds(env)
    assert parse_constraint("not (a > 4) and 1 < a <= 4").holds(env)
    assert not parse_constraint("1 < a < 3").holds(env)
    assert parse_constraint("a != -1").holds(env)
    assert not parse_constraint("b < 3").holds(env)  # incomparable: does not hold, does not raise


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "a.__class__", "a[0] == 1", "a + 1 == 2", "(lambda: 1)()",
    "[x for x in a]", "a if a else b", "a := 1", "f'{a}' == 'x'", "a is None", "a in (b, 1)",
    "not", "",
])
def test_constraint_rejects_everything_outside_the_whitelist(text):
    with pytest.raises(ConstraintSyntaxError):
        parse_constraint(text)


def test_constraint_unknown_name_is_named():
    with pytest.raises(ConstraintSyntaxError, match="mhc_gem"):
        parse_constraint("mhc_gem == 'bf16'", {"mhc_gemm"})


# ---- the shipped spaces --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dsv4_tiny_cpu", "dsv4_flash_decode", "dsv4_pro_decode"])
def test_shipped_spaces_load(name):
    s = load_declared(name)
    assert s.params and s.sha256 == hashlib.sha256(s.path.read_bytes()).hexdigest()
    base = s.baseline_params()
    assert s.violations(base) == []
    cfg = s.params_to_config(base)
    assert cfg["layer_overrides"] == []
    assert {k: v for k, v in cfg.items() if k != "layer_overrides"} == s.info.baseline


def test_tiny_space_is_small_and_per_layer_and_excludes_gpu_values_with_reasons():
    s = load_declared("dsv4_tiny_cpu")
    names = [p.name for p in s.params]
    assert {"mhc_gemm@window", "mhc_gemm@c4", "mhc_gemm@c128"} <= set(names)
    assert s.size() <= 512
    assert "needs a CUDA GPU" in s.excluded_knobs["attn_block_kv"]
    assert "needs a CUDA GPU" in s.excluded_knobs["cuda_graphs"]
    indexer = next(k for k in s.knobs if k.name == "indexer_gemm")
    assert "fp8" not in indexer.values and "FP8" in indexer.excluded["fp8"]
    # on a GPU the same file makes them parameters
    gpu = SearchSpace(s.doc, builtin_info("tiny", "cuda"))
    assert "attn_block_kv" in gpu.param_by_name and "cuda_graphs" in gpu.param_by_name


def test_declared_info_matches_the_builtin_target():
    from autoopt.targets.builtin.target import BuiltinTarget

    t = BuiltinTarget(preset="tiny", device="cpu")  # declarations only: no worker is started
    info = builtin_info("tiny", "cpu")
    assert list(info.knob_specs) == t.knob_specs()
    assert info.baseline == t.baseline() and list(info.layers) == t.layers()


# ---- scopes -> params -> config ------------------------------------------------------------------
def test_layer_class_and_layers_scopes_expand_to_layer_overrides(tmp_path):
    s = load(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16], scope: layer_class}
          attention: {values: [per_head, mma], scope: layer, layers: [1, 3]}
          moe_experts: {values: [loop, grouped], scope: {layer_class: [c128]}}
        """)
    assert s.info.layers == ("window", "c128", "c4", "c128")
    assert [p.name for p in s.params] == ["mhc_gemm@window", "mhc_gemm@c4", "mhc_gemm@c128",
                                          "attention@L1", "attention@L3", "moe_experts@c128"]
    p = s.baseline_params() | {"mhc_gemm@c128": "bf16", "attention@L3": "mma", "moe_experts@c128": "grouped"}
    cfg = s.params_to_config(p)
    # mhc_gemm is chosen over every layer: its global value (what hc_head reads) is the last layer's;
    # attention covers layers 1 and 3 only, so the others keep the baseline's global value
    assert cfg["mhc_gemm"] == "bf16" and cfg["attention"] == "per_head"
    assert cfg["layer_overrides"] == [[0, "mhc_gemm", "fp32"], [1, "moe_experts", "grouped"],
                                      [2, "mhc_gemm", "fp32"], [3, "attention", "mma"],
                                      [3, "moe_experts", "grouped"]]
    from dsv4.config import DecodeConfig, preset

    built = DecodeConfig.from_dict(preset("tiny").to_dict() | cfg)  # the model accepts it
    assert built.knob("attention", 3) == "mma" and built.knob("attention", 1) == "per_head"
    assert [built.knob("mhc_gemm", i) for i in range(4)] == ["fp32", "bf16", "fp32", "bf16"]


def test_parts_outside_the_layers_follow_the_last_layer(tmp_path):
    """A knob set per layer class on every layer leaves the global value to the head alone: it takes
    the last layer's value, so one value on every class builds the step with that value everywhere."""
    s = load(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16], scope: layer_class}
          moe_experts: {values: [loop, grouped], scope: {layer_class: [c128]}}
        """)
    every_bf16 = s.baseline_params() | {f"mhc_gemm@{c}": "bf16" for c in ("window", "c4", "c128")}
    cfg = s.params_to_config(every_bf16)
    assert cfg["mhc_gemm"] == "bf16" and cfg["layer_overrides"] == []  # hc_head's GEMM is bf16 too
    last_fp32 = every_bf16 | {"mhc_gemm@c128": "fp32"}  # layer 3, the last, is c128
    assert s.params_to_config(last_fp32)["mhc_gemm"] == "fp32"
    moe = s.params_to_config(s.baseline_params() | {"moe_experts@c128": "grouped"})
    assert moe["moe_experts"] == "loop"  # c128 is not every layer: the global value stays the baseline's


def test_the_hand_tuned_h200_row_is_a_point_of_the_flash_space():
    """benchmarks/h200_decode.py's hand-tuned row sets mHC knobs globally, the head included; the
    search must be able to build exactly that configuration."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from h200_decode import FAST
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    hand = {**FAST, "glue": "triton", "step_compile": "inductor", "proj_gemms": "stacked", "cuda_graphs": "on"}
    s = load_declared("dsv4_flash_decode")
    params = {p.name: hand.get(p.knob, s.info.baseline[p.knob]) for p in s.params}
    assert s.violations(params) == []
    baseline = {k: v for k, v in s.info.baseline.items() if k != "layer_overrides"}
    assert s.params_to_config(params) == {**baseline, **hand, "layer_overrides": []}


def test_constraints_hold_on_every_layer(tmp_path):
    s = load(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16], scope: layer_class}
          mhc_operand: {values: [cast_from_fp32, view_bf16_residual]}
        constraints:
          - "mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'"
        """)
    p = s.baseline_params() | {"mhc_operand": "view_bf16_residual", "mhc_gemm@c4": "bf16"}
    (problem,) = s.violations(p)
    assert "layer 0 (window)" in problem
    with pytest.raises(SpaceError, match="constraint"):
        s.validate_params(p)
    p.update({"mhc_gemm@window": "bf16", "mhc_gemm@c128": "bf16"})
    s.validate_params(p)
    with pytest.raises(SpaceError, match="not one of"):
        s.validate_params(p | {"mhc_operand": "nope"})
    with pytest.raises(SpaceError, match="unknown parameter"):
        s.validate_params(p | {"glue": "compile"})


def test_yaml_on_off_stay_strings_and_values_coerce(tmp_path):
    s = SearchSpace(load_declared(write(tmp_path, """
        knobs:
          cuda_graphs: {values: [off, on]}
          attn_split_k: {values: ['1', 2]}
        """)).doc, builtin_info("tiny", "cuda"))
    assert s.param_by_name["cuda_graphs"].choices == ("off", "on")
    assert s.param_by_name["attn_split_k"].choices == (1, 2)


def test_a_space_without_constraints_loads(tmp_path):
    for tail in ("", "constraints:\n", "constraints: []\n"):
        s = load(tmp_path, "knobs:\n  mhc_gemm: {values: [fp32, bf16], scope: layer_class}\n" + tail)
        assert s.constraints == [] and [p.name for p in s.params] == ["mhc_gemm@window", "mhc_gemm@c4",
                                                                       "mhc_gemm@c128"]
        assert s.is_feasible(s.baseline_params() | {"mhc_gemm@c4": "bf16"})


def test_constraints_may_name_scoped_parameters(tmp_path):
    """`mhc_gemm@c4` reads that parameter's value (the same on every layer); knob names still read the
    value in effect on each layer; '@' inside a string literal is left alone."""
    s = load(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16], scope: layer_class}
          mhc_operand: {values: [cast_from_fp32, view_bf16_residual]}
          attention: {values: [per_head, mma], scope: layer, layers: [3]}
        constraints:
          - "mhc_gemm@c4 == 'bf16' or mhc_operand == 'cast_from_fp32'"
          - "attention@L3 != 'mma' or mhc_gemm@window=='bf16'"
        """)
    assert [c.names for c in s.constraints] == [{"mhc_gemm@c4", "mhc_operand"},
                                                 {"attention@L3", "mhc_gemm@window"}]
    # '@' inside a literal is left alone (a value no knob has, so only parsed here, not loaded)
    assert parse_constraint("mhc_operand != 'x@y'").compared_values() == [("mhc_operand", "x@y")]
    base = s.baseline_params()
    assert s.is_feasible(base)
    view = base | {"mhc_operand": "view_bf16_residual"}
    (problem,) = s.violations(view)
    assert "mhc_gemm@c4 == 'bf16'" in problem
    assert s.is_feasible(view | {"mhc_gemm@c4": "bf16"})  # the other layer classes may stay fp32
    assert not s.is_feasible(base | {"attention@L3": "mma"})
    assert s.is_feasible(base | {"attention@L3": "mma", "mhc_gemm@window": "bf16"})
    c = parse_constraint("a@c4 in ('p@q', 'r') and b == 'k@v'", {"a@c4", "b"})
    assert c.names == {"a@c4", "b"} and c.holds({"a@c4": "p@q", "b": "k@v"}) and not c.holds({"a@c4": "r", "b": "k"})


def test_scoped_names_must_be_parameters_of_the_space(tmp_path):
    msg = error_of(tmp_path, "knobs:\n  mhc_gemm: {scope: layer_class}\nconstraints:\n  - \"mhc_gemm@c5 == 'bf16'\"\n")
    assert "space.yaml:10: constraints[0]: unknown name(s) mhc_gemm@c5" in msg, msg
    with pytest.raises(ConstraintSyntaxError, match="not allowed in a constraint: BinOp `a@b \\+ 1`"):
        parse_constraint("a @ b + 1 == 2")


def test_replay_space_takes_scoped_constraints(tmp_path):
    """A table recorded from a layer-class space has knobs named mhc_gemm@c4: its constraints use
    those names (the replay space loads them as written; no always-true stand-in)."""
    import shutil

    import yaml

    from autoopt.targets.replay.target import ReplayTarget, replay_space

    src = REPO / "benchmarks" / "data"
    shutil.copy(src / "tiny_cpu_grid.csv", tmp_path / "g.csv")
    meta = yaml.safe_load((src / "tiny_cpu_grid.restart.yaml").read_text())
    committed = meta.pop("constraints")  # the committed table carries its space's constraint
    (tmp_path / "g.restart.yaml").write_text(yaml.safe_dump(meta))
    plain = replay_space(ReplayTarget(tmp_path / "g.csv"))
    assert plain.constraints == []
    meta["constraints"] = ["mhc_operand == 'cast_from_fp32' or (mhc_gemm@window == 'bf16' and "
                           "mhc_gemm@c4 == 'bf16' and mhc_gemm@c128 == 'bf16')"]
    assert committed == meta["constraints"]
    (tmp_path / "g.restart.yaml").write_text(yaml.safe_dump(meta))
    space = replay_space(ReplayTarget(tmp_path / "g.csv"))
    assert [str(c) for c in space.constraints] == meta["constraints"]
    base = space.baseline_params()
    assert not space.is_feasible(base | {"mhc_operand": "view_bf16_residual"})
    assert space.is_feasible(base | {"mhc_operand": "view_bf16_residual", "mhc_gemm@window": "bf16",
                                     "mhc_gemm@c4": "bf16", "mhc_gemm@c128": "bf16"})


# ---- errors: file, line, key, what was expected --------------------------------------------------
@pytest.mark.parametrize("body, line, needle", [
    ("knobs:\n  mhc_gemm: {values: [fp32, bf16]}\nbogus: 1\n", 9, "bogus: unknown key"),
    ("knobs:\n  nope: {values: [a]}\n", 8, "knobs.nope: unknown knob"),
    ("knobs:\n  mhc_gemm:\n    values:\n      - fp32\n      - fp16\n", 11, "knobs.mhc_gemm.values[1]: expected one of: fp32, bf16; got 'fp16'"),
    ("knobs:\n  glue: {values: [eager, compile], scope: layer_class}\n", 8, "'layer_class' is not supported by this knob (expected: global)"),
    ("knobs:\n  attention:\n    restart_class: none\n", 9, "'none' is cheaper than the target declares ('recompile')"),
    ("knobs:\n  mhc_gemm: {values: [bf16]}\n", 8, "must include the baseline value 'fp32'"),
    ("knobs:\n  mhc_gemm: {scope: layer, layers: [0, 9]}\n", 8, "expected a layer index 0..3; got 9"),
    ("knobs:\n  indexer_gemm: {scope: layer, layers: [0]}\n", 8, "layer 0 is a window layer"),
    ("knobs:\n  mhc_gemm: {scope: layer_class, classes: [c5]}\n", 8, "expected one of: window, c4, c128"),
    ("knobs:\n  mhc_gemm: {scope: per_layer}\n", 8, "knobs.mhc_gemm.scope: expected global, layer_class"),
    ("knobs:\n  mhc_gemm: {}\n  mhc_gemm: {}\n", 9, "duplicate key 'mhc_gemm'"),
    ("knobs:\n  mhc_gemm: {}\nconstraints:\n  - mhc_gemm == 'bf16'\n  - open('x')\n", 11, "constraints[1]: not allowed"),
    ("knobs:\n  mhc_gemm: {}\nconstraints:\n  - mhc_gemmm == 'bf16'\n", 10, "unknown name(s) mhc_gemmm"),
    ("knobs:\n  mhc_gemm: {prior: {speedup: {bf16: -1}}}\n", 8, "expected a positive factor"),
    ("knobs: [a, b]\n", 7, "knobs: expected a mapping"),
    ("knobs:\n  mhc_gemm: {values: [fp32, bf16]\n", 9, "invalid YAML"),
])
def test_errors_name_file_line_key_and_expectation(tmp_path, body, line, needle):
    msg = error_of(tmp_path, body)
    assert msg.startswith(f"{tmp_path / 'space.yaml'}:{line}:") or f"space.yaml:{line}:" in msg, msg
    assert needle in msg, msg
    assert "\n" not in msg


def test_objective_must_be_measured(tmp_path):
    msg = error_of(tmp_path, "knobs:\n  mhc_gemm: {}\n",
                   header=HEADER.replace("objective: {concurrency: 4}", "objective: {weights: {4: 1, 16: 1}}"))
    assert "space.yaml:6: objective: concurrency 16 is not measured" in msg


def test_weighted_objective_is_a_geometric_mean(tmp_path):
    from autoopt.measurement import Measurement, throughput_from_step_times

    s = load(tmp_path, "knobs:\n  mhc_gemm: {}\n",
             header=HEADER.replace("objective: {concurrency: 4}", "objective: {weights: {1: 1, 4: 3}}"))
    assert s.objective.weights == {1: 0.25, 4: 0.75}
    m = Measurement(status="ok", config={}, tok_per_s={
        "1": throughput_from_step_times([0.01] * 8, 1), "4": throughput_from_step_times([0.01] * 8, 4)})
    assert s.objective.value(m) == pytest.approx(100 ** 0.25 * 400 ** 0.75)
    assert s.objective.value(Measurement.failed({}, "crash", "x")) is None


def test_unknown_space_name_lists_known_ones():
    with pytest.raises(SpaceError, match="dsv4_tiny_cpu"):
        load_declared("no_such_space")


# ---- `autoopt spaces` ----------------------------------------------------------------------------
def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    code = "import sys; from autoopt.cli import main; sys.argv = ['autoopt'] + sys.argv[1:]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True)


def test_spaces_lists_knobs_and_exclusions():
    out = _cli("spaces")
    assert out.returncode == 0, out.stderr
    for name in ("dsv4_tiny_cpu", "dsv4_flash_decode", "dsv4_pro_decode", "mhc_gemm", "layer_class"):
        assert name in out.stdout
    assert "excluded fp8: needs a GPU with native FP8" in out.stdout
    assert "attn_block_kv" in out.stdout and "dropped: excluded on this device: needs a CUDA GPU" in out.stdout
    doc = json.loads(_cli("spaces", "--json").stdout)
    tiny = next(e for e in doc["spaces"] if e["name"] == "dsv4_tiny_cpu")
    knob = next(k for k in tiny["knobs"] if k["name"] == "mhc_gemm")
    assert knob["scope"] == "layer_class" and knob["where"] == ["window", "c4", "c128"]
    assert knob["restart_class"] == "none" and "gemm_simt" in knob["buckets"]


def test_spaces_invalid_file_exits_2_with_one_line(tmp_path):
    p = write(tmp_path, "knobs:\n  mhc_gemm: {values: [fp32, fp16]}\n")
    out = _cli("spaces", str(p))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "space.yaml:8: knobs.mhc_gemm.values[1]: expected one of: fp32, bf16; got 'fp16'" in out.stderr


def test_packaged_copies_match_the_source_spaces():
    src = sorted((REPO / "search_spaces").glob("*.yaml"))
    packaged = sorted((REPO / "autoopt" / "data").glob("*.yaml"))
    assert [p.name for p in src] == [p.name for p in packaged], "copy search_spaces/*.yaml to autoopt/data/"
    for a, b in zip(src, packaged):
        assert a.read_bytes() == b.read_bytes(), f"autoopt/data/{b.name} differs from search_spaces/{a.name}"


def test_spaces_are_found_from_any_directory(tmp_path):
    out = _cli("spaces", "dsv4_tiny_cpu", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spaces"][0]["name"] == "dsv4_tiny_cpu"


# ---- constraints checked when the space is loaded (issue 12 item 6) --------------------------------
def test_constraint_naming_a_value_the_knob_does_not_have_is_an_error(tmp_path):
    msg = error_of(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16], scope: layer_class}
        constraints:
          - "mhc_gemm == 'bf1' or mhc_gemm@c4 in ('fp32',)"
        """)
    assert "constraints[0]" in msg and "'mhc_gemm' has no value 'bf1'" in msg and "fp32, bf16" in msg
    assert "space.yaml:11: " in msg  # file and line of the constraint


def test_unsatisfiable_constraint_is_an_error_at_load(tmp_path):
    msg = error_of(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16]}
        constraints:
          - "mhc_gemm == 'bf16' and mhc_gemm == 'fp32'"
        """)
    assert "constraints[0]" in msg and "holds for no value" in msg


def test_constraints_that_cannot_hold_together_are_an_error_at_load(tmp_path):
    msg = error_of(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16]}
          mhc_operand: {values: [cast_from_fp32, view_bf16_residual]}
        constraints:
          - "mhc_gemm == 'bf16'"
          - "mhc_operand == 'cast_from_fp32' and mhc_gemm == 'fp32'"
        """)
    assert "no configuration of this space satisfies every constraint together" in msg


def test_unsatisfiable_constraint_stops_a_run_with_exit_2(tmp_path):
    p = write(tmp_path, """
        knobs:
          mhc_gemm: {values: [fp32, bf16]}
        constraints:
          - "mhc_gemm != 'fp32' and mhc_gemm != 'bf16'"
        """)
    out = _cli("run", "--space", str(p), "--db", str(tmp_path / "db.sqlite"), "--max-trials", "2")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("error: ") and out.stderr.strip().count("\n") == 0
    assert "constraints[0]" in out.stderr
    assert not (tmp_path / "db.sqlite").exists() or "baseline" not in out.stdout  # nothing measured
