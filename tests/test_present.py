"""The book's shared presentation helpers (portbench.present) and the data downloads of the book."""

import pandas as pd
import pytest

from portbench import book, present, stats
from portbench.campaign import load_results


def test_numbers_take_a_true_minus_sign_and_the_digits_asked():
    assert present.num(-0.0241, 3) == "\u22120.024"
    assert present.signed(0.012, 3) == "+0.012" and present.signed(-0.2, 3) == "\u22120.200"
    assert present.signed(-0.0004, 3) == "0.000"          # rounds to zero: no sign
    assert present.num(12345.678, 1) == "12,345.7"
    assert present.num(float("nan")) == "n/a" and present.num(None) == "n/a"
    assert present.pct(0.254) == "25%"
    assert present.sci(3.2e-5) == "3.2 × 10⁻⁵" and present.sci(0.25) == "0.250"
    assert present.minus_signs("-0.024 and x-1 and [-1.5]") == "\u22120.024 and x-1 and [\u22121.5]"
    with pytest.raises(ValueError, match="digits"):
        present.num(1.0, -1)


def test_words_read_for_zero_one_and_many():
    assert present.count(0, "test") == "0 tests" and present.count(1, "test") == "1 test"
    assert present.count(2, "policy", "policies") == "2 policies"
    assert present.join([]) == "none" and present.join(["a"]) == "a"
    assert present.join(["a", "b"]) == "a and b" and present.join(["a", "b", "c"]) == "a, b and c"
    assert present.went_from(2, {"refused": 0, "chunked": 0}) == "from 2 to 0 in either case"
    assert present.went_from(2, {"refused": 0, "chunked": 1}) == "from 2 to 0 (refused) and 1 (chunked)"


def test_labels_replace_identifiers():
    assert present.label("SUPPORTED_PRACTICAL_REVERSAL") == "supported practical reversal"
    assert present.label("anwg") == "ANWG" and present.label("burstgpt") == "BurstGPT"
    assert present.label("slai_faithful") == "slai_faithful"          # policy ids stay
    assert present.label("HIGH_PRESSURE") == "HIGH_PRESSURE"          # region names stay


def test_tables_hide_a_positional_index_and_round():
    frame = pd.DataFrame({"cls": ["STABLE", "SUPPORTED_PRACTICAL_REVERSAL"], "tau_b": [0.123456, -0.5],
                          "bh": [True, False]}, index=[3, 0])
    html = present.table(frame, digits=2).to_html()
    assert "supported practical reversal" in html and "SUPPORTED_" not in html
    assert "\u22120.50" in html and "0.12" in html and "0.123456" not in html
    assert ">yes<" in html and ">no<" in html and "τ_b" in html
    assert ">3<" not in html                       # the shuffled 0..n index is not shown
    named = present.table(pd.Series({"azure_llm_2024": 1.5}, name="x").rename_axis("source"), digits=1).to_html()
    assert ">source<" in named and ">Azure<" in named and ">1.5<" in named


def test_condition_means_csv_equals_the_chapters_means():
    table = load_results("lssp")
    means = book.condition_means_table(table)
    base = means[means["slo_multiplier"] == 20.0].set_index(["source", "region", "policy"])
    ours = stats.condition_means(table, "anwg").means
    for (source, region), column in ours.items():
        for policy, value in column.items():
            assert base.loc[(source, region, policy), "anwg"] == pytest.approx(value, abs=1e-12)
    assert set(base["n_windows"]) == {40}
    with pytest.raises(ValueError, match="not a campaign table"):
        book.condition_means_table(table.drop(columns=["anwg"]))


def test_downloads_list_every_table_with_its_size(tmp_path):
    rows = book.prepare_downloads(tmp_path)
    listing = (tmp_path / book.DOWNLOADS / "files.md").read_text()
    for row in rows:
        assert (tmp_path / book.DOWNLOADS / row["file"]).stat().st_size == row["bytes"] > 0
        assert f"`{row['file']} <{book.DOWNLOADS}/{row['file']}>`" in listing
        assert book.human_size(row["bytes"]) in listing
    files = {r["file"] for r in rows}
    assert {"campaign_lssp.parquet", "condition_means_lssp.csv", "campaign_vllm_v1.parquet",
            "vllm_cpu_guarded_case_runs.parquet"} <= files
    assert book.human_size(298) == "298 bytes" and book.human_size(2_053_315) == "2.1 MB"
    assert book.human_size(127_400) == "127 kB"
