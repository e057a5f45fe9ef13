"""cudaforge/reporting (summary, markdown, html): the paper's numbers on a small hand-made results
file whose answers are worked out below, the markdown and HTML renderings, and the errors for
unusable files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from cudaforge.cli.bench import BenchProblem, run_bench
from cudaforge.reporting.summary import report, summarize

SVG = "{http://www.w3.org/2000/svg}"

# FIXTURE records. Level 1: a 2.5x, b 1.2x, c 0.5x, d no correct kernel (first recorded as an
# error, then retried: its last record counts). Level 2: e exactly 1.5x (not fast_1.5: the
# threshold is strict), f an exception (cost unknown).
RECORDS = [
    {"key": "level1/1_a", "problem": "1_a", "level": 1, "problem_id": 1, "status": "ok",
     "correct": True, "speedup": 2.5, "speedup_vs_compile": 1.25, "cost_usd": 0.2, "seconds": 60,
     "rounds": 4, "meta": {"coder": "scripted:"}},
    {"key": "level1/2_b", "problem": "2_b", "level": 1, "problem_id": 2, "status": "ok",
     "correct": True, "speedup": 1.2, "speedup_vs_compile": 0.6, "cost_usd": 0.4, "seconds": 120,
     "rounds": 10},
    {"key": "level1/4_d", "problem": "4_d", "level": 1, "problem_id": 4, "status": "error",
     "correct": False, "cost_usd": None, "seconds": 5, "error": "RuntimeError: retried later"},
    {"key": "level1/3_c", "problem": "3_c", "level": 1, "problem_id": 3, "status": "ok",
     "correct": True, "speedup": 0.5, "cost_usd": 0.3, "seconds": 180, "rounds": 10},
    {"key": "level1/4_d", "problem": "4_d", "level": 1, "problem_id": 4, "status": "incorrect",
     "correct": False, "speedup": None, "cost_usd": 0.5, "seconds": 240, "rounds": 10,
     "error": "output 0: max abs err 3 > atol 1e-4 & <rtol>"},
    {"key": "level2/1_e", "problem": "1_e", "level": 2, "problem_id": 1, "status": "ok",
     "correct": True, "speedup": 1.5, "cost_usd": 0.6, "seconds": 300, "rounds": 2,
     "unpriced_calls": 3},
    {"key": "level2/2_f", "problem": "2_f", "level": 2, "problem_id": 2, "status": "error",
     "correct": False, "cost_usd": None, "seconds": 600, "error": "ValueError: a < b"},
]  # fmt: skip


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return path


def test_overall_numbers(results):
    s = report(results)
    o = s.overall
    assert o.label == "all" and o.problems == 6 and o.correct == 4
    assert s.superseded == 1  # d's error record, replaced by its retry
    assert o.correct_rate == pytest.approx(4 / 6)
    assert o.fast_p["fast_0"] == pytest.approx(o.correct_rate)
    assert o.fast_p["fast_1"] == pytest.approx(3 / 6)  # a, b, e
    assert o.fast_p["fast_1.5"] == pytest.approx(1 / 6)  # a only: e is exactly 1.5
    assert o.fast_p["fast_2"] == pytest.approx(1 / 6)
    assert o.speedup_n == 4
    assert o.mean_speedup == pytest.approx((2.5 + 1.2 + 0.5 + 1.5) / 4)
    assert o.geomean_speedup == pytest.approx((2.5 * 1.2 * 0.5 * 1.5) ** 0.25)
    assert o.median_speedup == pytest.approx((1.2 + 1.5) / 2)
    assert o.mean_speedup_all == pytest.approx((2.5 + 1.2 + 0.5 + 1 + 1.5 + 1) / 6)
    assert o.geomean_speedup_all == pytest.approx((2.5 * 1.2 * 0.5 * 1.5) ** (1 / 6))
    assert o.compile_n == 2 and o.mean_speedup_vs_compile == pytest.approx(0.925)
    assert o.cost_usd_total == pytest.approx(2.0) and o.cost_known == 5
    assert o.cost_usd_per_kernel == pytest.approx(0.4)  # over the 5 problems with a known cost
    assert o.seconds_per_kernel == pytest.approx((60 + 120 + 180 + 240 + 300 + 600) / 6)
    assert o.unpriced == 1 and o.errors == 1
    assert o.statuses == {"ok": 4, "incorrect": 1, "error": 1}


def test_per_level_numbers(results):
    s = report(results)
    assert [g.label for g in s.groups] == ["level 1", "level 2", "all"]
    one, two = s.level(1), s.level(2)
    assert one.problems == 4 and one.correct == 3
    assert [one.fast_p[k] for k in ("fast_1", "fast_1.5", "fast_2")] == pytest.approx(
        [2 / 4, 1 / 4, 1 / 4]
    )
    assert one.mean_speedup == pytest.approx(1.4)
    assert one.geomean_speedup == pytest.approx(1.5 ** (1 / 3))
    assert two.problems == 2 and two.correct == 1 and two.fast_p["fast_1"] == pytest.approx(0.5)
    assert two.fast_p["fast_1.5"] == 0 and two.mean_speedup == pytest.approx(1.5)
    assert two.cost_usd_per_kernel == pytest.approx(0.6) and two.cost_known == 1
    with pytest.raises(KeyError):
        s.level(3)


def test_markdown_table(results):
    md = report(results).to_markdown()
    assert "| level 1 | 4 | 75.0% (3) | 50.0% | 25.0% | 25.0% | 1.40x | 1.14x | 1.30x |" in md
    assert "| **all** | 6 | 66.7% (4) | 50.0% | 16.7% | 16.7% | 1.43x | 1.22x | 1.28x |" in md
    assert "n = 4 of 6" in md and "Settings: coder scripted:" in md
    assert "1 problems called a model without a known price" in md
    # one row per problem, the retried one once, with its last status
    assert md.count("| level1/4_d |") == 1 and "| level1/4_d | 1 | incorrect |" in md
    assert "\\| " not in md.split("## Problems")[0]  # nothing needed escaping in the summary
    assert "## Problems" not in report(results).to_markdown(problems=False)


def test_html_is_well_formed_and_has_the_plots(results):
    page = report(results).to_html()
    assert page.startswith("<!DOCTYPE html>")
    root = ET.fromstring(page)  # raises on any unclosed tag or unescaped '<' or '&'
    charts = {svg.get("id"): svg for svg in root.iter(f"{SVG}svg")}
    assert set(charts) == {"speedup-histogram", "speedup-bars", "time-bars", "cost-bars"}

    def tips(chart_id: str) -> list[str]:
        return [t.text for r in charts[chart_id].iter(f"{SVG}rect") for t in r.iter(f"{SVG}title")]

    histogram = tips("speedup-histogram")
    assert "no correct kernel: 2 problems" in histogram
    assert "\u22640.5x: 1 problems of level 1" in histogram  # c
    assert "1\u20131.25x: 1 problems of level 1" in histogram  # b
    assert "1.25\u20131.5x: 1 problems of level 2" in histogram  # e: bins are (lo, hi]
    assert "2\u20133x: 1 problems of level 1" in histogram  # a
    bars = tips("speedup-bars")
    assert len(bars) == 6 and "level1/1_a: 2.5x" in bars
    assert any(t.startswith("level2/2_f: error (ValueError: a < b)") for t in bars)
    assert len(tips("time-bars")) == 6 and len(tips("cost-bars")) == 4 + 1  # f's cost unknown
    # self-contained: no scripts, no fetched resources
    assert "<script" not in page and "src=" not in page and "<link" not in page


def test_html_without_correct_problems_still_draws(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"key": "x", "status": "compile_error", "correct": False}) + "\n")
    s = report(path)
    assert s.overall.mean_speedup is None and s.overall.fast_p["fast_0"] == 0
    assert s.groups[-1].label == "all" and len(s.groups) == 1
    ET.fromstring(s.to_html())
    assert "| **all** | 1 | 0.0% (0) | 0.0% | 0.0% | 0.0% | - | - | 1.00x |" in s.to_markdown()


def test_empty_and_missing_files_give_clear_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no benchmark records"):
        report(empty)
    torn_only = tmp_path / "torn.jsonl"
    torn_only.write_text('{"key": "level1/1_a", "sta')
    with pytest.raises(ValueError, match="only an unfinished line"):
        report(torn_only)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        report(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="no benchmark records"):
        summarize([])


def test_a_run_still_writing_is_read_without_its_last_line(results):
    with open(results, "a", encoding="utf-8") as f:
        f.write('{"key": "level2/3_g", "status": "o')
    s = report(results)
    assert s.torn_lines == 1 and s.overall.problems == 6
    assert "1 unfinished last line left out" in s.to_markdown()


def test_several_files_last_record_wins(results, tmp_path):
    rerun = tmp_path / "rerun.jsonl"
    rerun.write_text(
        json.dumps({"key": "level2/2_f", "level": 2, "problem_id": 2, "status": "ok",
                    "correct": True, "speedup": 3.0, "cost_usd": 0.1, "seconds": 10}) + "\n"
    )  # fmt: skip
    s = report(results, rerun)
    assert s.overall.problems == 6 and s.overall.correct == 5 and s.superseded == 2
    assert s.level(2).fast_p["fast_2"] == pytest.approx(0.5)
    assert json.loads(s.to_json())["groups"][-1]["correct"] == 5


def test_bench_output_feeds_the_report(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = [
        BenchProblem(f"level1/{i}_p", f"{i}_p", 1, i, "def get_inputs(): ...", None)
        for i in range(1, 5)
    ]

    def forge_one(problem):
        if problem.problem_id == 4:
            raise RuntimeError("FIXTURE failure")
        return {"status": "ok", "correct": True, "speedup": float(problem.problem_id)}

    run_bench(problems, forge_one, results, progress=None)
    o = report(results).overall
    assert o.problems == 4 and o.correct == 3 and o.errors == 1
    assert o.fast_p["fast_1"] == pytest.approx(2 / 4)  # speedups 2 and 3 beat 1; 1 does not
    assert o.geomean_speedup == pytest.approx(math.prod([1.0, 2.0, 3.0]) ** (1 / 3))


def test_optimize_chart_is_well_formed_and_numbers_read_alike():
    from cudaforge.reporting.formatting import milliseconds, times
    from cudaforge.reporting.html import before_after_svg

    svg = ET.fromstring(before_after_svg([("end to end", 2.0, 1.0), ("a <b> & c", 0.05, None)]))
    tips = [r.find(f"{SVG}title").text for r in svg.iter(f"{SVG}rect")]
    assert tips == [
        "end to end, before: 2 ms",
        "end to end, after: 1 ms",
        "a <b> & c, before: 0.05 ms",
    ]
    assert times(None) == "-" and times(None, "n/a") == "n/a" and times(1.234) == "1.23x"
    assert milliseconds(0.05) == "50.0 us" and milliseconds(2.0) == "2 ms"
