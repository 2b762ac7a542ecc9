"""What new real-engine runs record for a step-by-step schedule comparison, and the RQ6 script's
engine configurations (issue 26), without an engine: the backend's pure helpers and a fake backend."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from portbench.realengine import vllm_backend as vb
from portbench.realengine import study
from test_realengine_guards import FakeEngine, out_dir, run_case, windows

ROOT = Path(__file__).resolve().parents[1]


def test_scheduled_batch_round_trips_through_its_string():
    batch = {"r7-3-1a2b3c4d": 512, "r7-12-ffee0011": 1, "r7-0": 1, "warmup-2": 4}
    text = vb.format_scheduled(batch)
    assert text == "3:512;12:1;0:1;warmup-2:4"                  # vLLM's internal suffix dropped
    assert vb.parse_scheduled(text) == {"3": 512, "12": 1, "0": 1, "warmup-2": 4}
    assert list(vb.parse_scheduled(text)) == ["3", "12", "0", "warmup-2"]    # batch order kept
    for empty in ("", None, float("nan")):
        assert vb.parse_scheduled(empty) == {}
    assert {"scheduled", "preempted"} <= set(vb.SCHED_COLUMNS)


def test_replay_ids_sort_as_text_in_window_order():
    # vLLM breaks a tie of (priority, arrival) by the request id's text: padded ids keep the
    # window's order there, as the simulator breaks ties
    ids = [vb.replay_request_id("r3", i) for i in (0, 9, 10, 123456)]
    assert ids == sorted(ids)
    assert [vb._request_key(f"{rid}-a1b2c3") for rid in ids] == ["0", "9", "10", "123456"]
    assert vb.format_scheduled({f"{ids[2]}-ffee": 1, ids[1]: 7}) == "10:1;9:7"


def test_equal_admission_gives_both_policies_the_same_limit():
    for policy in study.CASE_POLICIES:
        assert vb.engine_config(policy, **vb.EQUAL_ADMISSION).max_model_len == 2560
    default = {p: vb.engine_config(p).max_model_len for p in study.CASE_POLICIES}
    assert default == {"slai_faithful": 32768, "vllm_faithful": 2560}    # the committed case's limits
    faithful = vb.engine_config("vllm_faithful", **vb.EQUAL_ADMISSION)
    assert (faithful.max_num_batched_tokens, faithful.enable_chunked_prefill) == (2560, False)
    # vLLM v1 refuses max_model_len > budget without chunked prefill: said here, before vLLM
    with pytest.raises(ValueError, match="without chunked prefill"):
        vb.engine_config("vllm_faithful", max_model_len=32768)
    assert vb.engine_config("vllm_faithful", max_model_len=32768, enable_chunked_prefill=True).max_model_len == 32768


def test_study_configuration_is_the_same_engine_for_both_policies():
    engine = {k: v for k, v in vb.STUDY_ENGINE.items() if k != "max_in_flight"}
    cfgs = {p: vb.engine_config(p, kv_cache_gib=vb.STUDY_KV_CACHE_GIB, **engine) for p in study.CASE_POLICIES}
    for cfg in cfgs.values():
        assert (cfg.max_model_len, cfg.max_num_batched_tokens, cfg.max_num_seqs,
                cfg.enable_chunked_prefill) == (32768, 32768, 256, False)
    assert cfgs["vllm_faithful"].scheduling_policy == "fcfs" and cfgs["vllm_faithful"].scheduler_cls is None
    assert cfgs["slai_faithful"].scheduling_policy == "priority" and cfgs["slai_faithful"].scheduler_cls


class LoggingEngine(FakeEngine):
    """The fake engine with what a vLLM replay now records: each request's submission clock and step,
    and each step's batch."""

    def replay(self, window, policy, **kwargs):
        result, info = super().replay(window, policy, **kwargs)
        n = len(window)
        submit = np.asarray(window.arrival_s, dtype=float) + 1e-4
        submit[info["rejected"]] = np.nan
        info["submit_s"] = submit
        info["submit_step"] = np.where(np.isnan(submit), -1, 0)
        info["steps"] = dict(info["steps"], scheduled=["0:64", "0:1;1:1", None],
                             preempted=["", "", None])
        self.kwargs = kwargs
        assert len(info["submit_s"]) == n
        return result, info


def test_case_stores_the_submission_clock_and_the_batch_of_every_step(tmp_path):
    ws = windows(1)
    engine = LoggingEngine()
    run_case(engine.backend(), windows=ws, tag="log", data_dir=tmp_path, progress=False,
                   speed_ratio=0.1, repetitions=1, lambda_policy="vllm_faithful", engine_kwargs={"max_in_flight": 32})
    out = out_dir(tmp_path)
    requests = pd.read_parquet(out / "log_requests.parquet")
    assert {"submit_s", "submit_step"} <= set(requests.columns)
    refused = requests["refused"].to_numpy()
    assert requests.loc[refused, "submit_s"].isna().all() and (requests.loc[refused, "submit_step"] == -1).all()
    assert (requests.loc[~refused, "submit_s"] >= requests.loc[~refused, "arrival_s"]).all()
    steps = pd.read_parquet(out / "log_steps.parquet")
    assert steps["scheduled"].tolist()[:2] == ["0:64", "0:1;1:1"] and pd.isna(steps["scheduled"][2])
    assert [vb.parse_scheduled(t) for t in steps["scheduled"][:3]] == [{"0": 64}, {"0": 1, "1": 1}, {}]
    meta = json.loads((out / "log.json").read_text())
    assert meta["case"]["lambda_policy"] == "vllm_faithful"
    assert meta["engine_kwargs"]["max_in_flight"] == "32" and engine.kwargs["max_in_flight"] == 32
    assert "fifo" not in {c[1] for c in engine.calls}            # the λ_ref search replayed vllm_faithful
    # a resumed case must search λ_ref the same way
    with pytest.raises(ValueError, match="λ_ref searches replayed 'vllm_faithful'"):
        run_case(LoggingEngine().backend(), windows=ws, tag="log", data_dir=tmp_path, progress=False,
                       speed_ratio=0.1, repetitions=2)


def test_a_case_written_before_the_new_columns_resumes(tmp_path):
    """Old files (no submit_s, submit_step, scheduled) stay readable: a resumed case appends new runs
    with the columns and leaves the old rows empty."""
    ws = windows(1)
    kw = dict(windows=ws, tag="old", data_dir=tmp_path, progress=False, speed_ratio=0.1)
    run_case(FakeEngine().backend(), repetitions=1, **kw)
    out = out_dir(tmp_path)
    assert "submit_s" not in pd.read_parquet(out / "old_requests.parquet")
    run_case(LoggingEngine().backend(), repetitions=2, **kw)
    requests = pd.read_parquet(out / "old_requests.parquet")
    new = requests["repetition"] == 1
    assert requests.loc[~new, "submit_s"].isna().all() and requests.loc[new, "submit_s"].notna().any()
    steps = pd.read_parquet(out / "old_steps.parquet")
    assert steps.loc[steps["repetition"] == 0, "scheduled"].isna().all()


def _script():
    spec = importlib.util.spec_from_file_location("rq6_vllm_cpu", ROOT / "benchmarks" / "rq6_vllm_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rq6_script_configs_have_their_own_tags_and_valid_engines():
    mod = _script()
    assert len({c["tag"] for c in mod.CONFIGS.values()}) == len(mod.CONFIGS)
    assert mod.CONFIGS["policy"]["tag"] == "vllm_cpu_guarded"          # the committed case
    for name, config in mod.CONFIGS.items():
        engine = {k: v for k, v in config["engine"].items() if k != "max_in_flight"}
        limits = {vb.engine_config(p, **engine).max_model_len for p in study.CASE_POLICIES}
        assert len(limits) == (2 if name == "policy" else 1), name
