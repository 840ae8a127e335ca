"""The ui in real headless Chromium over a real run: what each page shows is checked against the
run's own files (metrics.jsonl, the built trajectories and triplets, the spans)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tinkertrace
from tinkertrace.training.metrics import read_metrics
from tinkertrace.training.outcomes import outcome_rows, read_outcomes
from tinkertrace.ui.server import UiServer

from .conftest import SCRIPT_TEXT, Run, record_rollouts

pytestmark = pytest.mark.slow


def built(run: Run, name: str) -> list[dict[str, Any]]:
    return (
        pq.read_table(run.log_dir / "build" / f"{name}.parquet")
        .drop_columns([c for c in ("end_time",) if name == "trajectories"])
        .to_pylist()
    )


def outcomes(run: Run) -> list[dict[str, Any]]:
    return read_outcomes(run.log_dir)


def trained_tokens(run: Run, rows: list[dict[str, Any]]) -> int:
    """Tokens of these trajectory rows that went into a trained Datum (outcomes.jsonl: the tokens kept)."""
    kept = {(o["rollout_id"], o["agent_name"], o["segment"]): o["tokens"]
            for o in outcomes(run) if o["outcome"] == "trained"}  # fmt: skip
    total = 0
    for r in rows:
        n = kept.get((r["rollout_id"], r["agent_name"], r["segment"]), 0)
        total += sum(r["action_mask"][1:n])
    return total


def rollouts_made(run: Run) -> int:
    con = duckdb.connect()
    glob = str(run.spans / "**" / "*.parquet")
    return con.execute(
        f"SELECT count(DISTINCT rollout_id) FROM read_parquet('{glob}') WHERE span_type = 'rollout'"
    ).fetchone()[0]  # type: ignore[index]


def test_run_page_plots_every_logged_step(run: Run, ui: UiServer, page: Any) -> None:
    steps = len(read_metrics(run.log_dir))
    assert steps >= 2
    page.goto(ui.url)
    reward_plot = page.locator('.plot[data-title="reward"]')
    reward_plot.wait_for()
    assert reward_plot.get_attribute("data-points") == str(steps)
    assert page.locator("#metrics-steps").inner_text().startswith(f"{steps} steps")
    assert page.locator(".plot canvas").count() >= 3  # uPlot drew reward, loss, KL at least
    assert page.locator("#count-rollouts").inner_text() == str(rollouts_made(run))
    trained = {r for line in (run.log_dir / "checkpoints.jsonl").read_text().splitlines()
               for r in json.loads(line)["trained_rollout_ids"]}  # fmt: skip
    assert page.locator("#count-trained").inner_text() == str(len(trained))
    assert page.locator("#settings").inner_text().count("groups_per_batch") == 1


def test_rollouts_are_paged_sorted_filtered_and_searched(run: Run, ui: UiServer, page: Any) -> None:
    total = rollouts_made(run)
    page.goto(ui.url + "rollouts?per_page=25")
    assert page.locator("#total").inner_text() == str(total)
    assert page.locator("#rollout-table tbody tr").count() == 25
    page.locator("#next").click()
    page.wait_for_url(re.compile(r"page=2"))
    assert page.locator("#rollout-table tbody tr").count() == total - 25

    # sort by reward, ascending then descending, by clicking the header
    page.goto(ui.url + "rollouts?per_page=100")
    page.locator('a.sort[data-sort="reward"]').click()
    page.wait_for_url(re.compile(r"sort=reward"))
    first = page.locator("#rollout-table tbody tr").first.locator("td").nth(4).inner_text()
    page.locator('a.sort[data-sort="reward"]').click()
    page.wait_for_url(re.compile(r"order=asc"))
    ascending = page.locator("#rollout-table tbody tr").first.locator("td").nth(4).inner_text()
    assert (float(first), float(ascending)) == (1.0, 0.0)

    # text search and a task filter
    page.locator("#search").fill("task-3")
    page.locator("#filters button[type=submit]").click()
    page.wait_for_url(re.compile(r"q=task-3"))
    assert page.locator("#total").inner_text() == "3"
    assert set(page.locator("#rollout-table tbody td:nth-child(2)").all_inner_texts()) == {"task-3"}
    page.goto(ui.url + "rollouts?trained=1")
    trained_rows = int(page.locator("#total").inner_text())
    page.goto(ui.url + "rollouts?trained=0")
    assert trained_rows + int(page.locator("#total").inner_text()) == total


def test_walk_run_to_rollout_to_trajectory(run: Run, ui: UiServer, page: Any) -> None:
    page.goto(ui.url)
    page.locator("nav a", has_text="rollouts").click()
    page.locator("#search").fill("split-task")
    page.locator("#filters button[type=submit]").click()
    page.wait_for_url(re.compile(r"q=split-task"))
    page.locator(f'tr[data-rollout="{run.split_rollout}"] a').first.click()
    page.wait_for_url(re.compile(r"/rollouts/"))
    assert page.locator("#rollout-id").inner_text() == run.split_rollout

    # the calls and the reward as the trainer's build has them
    calls = [t for t in built(run, "triplets") if t["rollout_id"] == run.split_rollout]
    assert page.locator("#calls tbody tr").count() == len(calls) == 3
    (rewarded,) = [t for t in calls if t["reward"] is not None]
    landed = page.locator("#rewards tbody tr").first.locator(".landed").inner_text()
    assert landed == f"call {rewarded['turn']}"
    assert page.locator("#timeline .span-row[data-kind=llm]").count() == 3
    assert page.locator("#timeline .span-row[data-kind=reward]").count() == 1

    page.locator("#trajectory-links a").first.click()
    page.wait_for_url(re.compile(r"/trajectory/"))
    rows = sorted((r for r in built(run, "trajectories") if r["rollout_id"] == run.split_rollout),
                  key=lambda r: r["segment"])  # fmt: skip
    assert page.locator("#token-count").inner_text() == str(sum(len(r["tokens"]) for r in rows))
    assert page.locator("#sampled-count").inner_text() == str(sum(sum(r["action_mask"]) for r in rows))
    assert page.locator("#trained-count").inner_text() == str(trained_tokens(run, rows))
    assert page.locator(".segment").count() == len(rows) == 2
    assert page.locator(".split-reason").inner_text() == f"split: {rows[1]['split_reason']}"
    assert rows[1]["split_reason"] == "template_change"
    # where the new segment's sequence parts from the previous one (the system prompt changed)
    parted = next(
        i for i, (x, y) in enumerate(zip(rows[0]["tokens"], rows[1]["tokens"], strict=False)) if x != y
    )
    assert page.locator(".parted-at").inner_text() == f"· parts from the previous segment at token {parted}"
    assert page.locator(".segment").nth(1).locator(".tok.parts").get_attribute("data-i") == str(parted)
    # tokens carry their mask and logprob; clicking one shows its numbers
    sampled = page.locator(".segment").first.locator(".tok.trained").first
    i = int(sampled.get_attribute("data-i"))
    assert rows[0]["action_mask"][i] == 1
    assert float(sampled.get_attribute("data-lp")) == pytest.approx(rows[0]["logprobs"][i], abs=1e-4)
    sampled.click()
    assert f"token {i} · id {rows[0]['tokens'][i]} · trained" in page.locator("#token-detail").inner_text()
    # the text is the decoded tokens: the first segment starts with the rendered chat
    text = page.locator(".segment").first.locator(".tokens").inner_text()
    assert "be brief" in text and "be verbose" in page.locator(".segment").nth(1).inner_text()


def test_other_reward_policy_is_built_on_demand(run: Run, ui: UiServer, page: Any) -> None:
    page.goto(ui.url + f"rollouts/{run.split_rollout}")
    page.locator("#policy").select_option("final")
    page.wait_for_url(re.compile(r"policy=final"))
    assert "built now from" in page.locator("#built-source").inner_text()
    rewards = page.locator("#calls .call-reward").all_inner_texts()
    assert rewards == ["0.000"] * 3  # under `final` every call carries the rollout's final reward
    assert page.locator("#rewards .landed").inner_text() == "every call (the rollout's final reward)"


def test_span_text_is_shown_as_text_never_as_html(run: Run, ui: UiServer, page: Any) -> None:
    page.goto(ui.url + f"rollouts/{run.script_rollout}")
    messages = page.locator("#messages")
    assert SCRIPT_TEXT in messages.inner_text()
    assert messages.locator("script").count() == 0 and messages.locator("b").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.goto(ui.url + f"trajectory/{run.script_rollout}")
    assert SCRIPT_TEXT in page.locator(".tokens").inner_text()
    assert page.evaluate("window.__pwned") is None


def test_build_report_links_the_rollouts_concerned(run: Run, ui: UiServer, page: Any) -> None:
    page.goto(ui.url + "build")
    page.locator("#unmatched-count").wait_for(timeout=60_000)  # the page reloads when the build is done
    assert page.locator("#unmatched-count").inner_text() == "1"
    assert page.locator("#retokenized-count").inner_text() == "1"
    page.locator("#unmatched a").first.click()
    page.wait_for_url(re.compile(r"/rollouts/"))
    assert page.locator("#rollout-id").inner_text() == run.unmatched_rollout
    landed = page.locator("#rewards .landed").all_inner_texts()
    assert landed == ["unmatched: no call took it", "call 0"]
    page.goto(ui.url + "build")
    page.locator("#retokenized a").first.click()
    page.wait_for_url(re.compile(r"/rollouts/"))
    assert page.locator("#rollout-id").inner_text() == run.retokenized_rollout
    assert page.locator("#calls").inner_text().count("re-tokenised") == 1
    page.locator("#trajectory-links a").first.click()
    page.wait_for_url(re.compile(r"/trajectory/"))
    (call,) = [t for t in built(run, "triplets") if t["rollout_id"] == run.retokenized_rollout]
    assert call["token_source"] == "retokenized"
    every_token = str(len(call["prompt_token_ids"]) + len(call["response_token_ids"]))
    assert page.locator("#token-count").inner_text() == every_token
    assert page.locator("#retokenized-count").inner_text() == every_token


def test_a_live_run_shows_new_rollouts_and_steps(run: Run, tmp_path: Path, page: Any) -> None:
    """A copy of the run keeps growing while the pages are open: no reload, no restart."""
    live = tmp_path / "live"
    shutil_copy(run, live)
    with UiServer([live], refresh_s=0.2) as server:
        page.goto(server.url + "rollouts")
        before = int(page.locator("#total").inner_text())
        record_rollouts(live / "spans", run.server)  # five more traced rollouts ... and 27 simple ones
        added = 27 + 5
        page.wait_for_function(f"document.querySelector('#total').textContent === '{before + added}'")
        page.goto(server.url)
        metrics = live / "train" / "metrics.jsonl"
        steps = len(read_metrics(live / "train"))
        page.locator(f'.plot[data-title="reward"][data-points="{steps}"]').wait_for()
        with metrics.open("a") as fh:
            fh.write(json.dumps({"step": steps, "env/all/reward/total": 0.5}) + "\n")
        page.locator(f'.plot[data-title="reward"][data-points="{steps + 1}"]').wait_for()
        assert page.locator("#count-rollouts").inner_text() == str(before + added)


def shutil_copy(run: Run, to: Path) -> None:
    import shutil

    shutil.copytree(run.spans, to / "spans")
    shutil.copytree(run.log_dir, to / "train")
    tinkertrace.flush()


def test_training_outcome_of_each_rollout_is_the_trainers_record(run: Run, ui: UiServer, page: Any) -> None:
    """Trained at step N (the plots' numbering) or dropped with the reason, as outcomes.jsonl says;
    a dropped rollout's sampled tokens are not shown as trained."""
    records = outcomes(run)
    trained: dict[str, list[int]] = {}
    for o in records:
        if o["outcome"] == "trained":
            trained.setdefault(o["rollout_id"], []).append(o["step"])
    dropped = {o["rollout_id"]: o["reason"] for o in records if o["outcome"] == "dropped"}
    assert dropped and set(dropped) & set(trained) == set()
    assert run.script_rollout in dropped  # a group of one: its reward is constant

    page.goto(ui.url + "rollouts?outcome=dropped&per_page=100")
    assert page.locator("#total").inner_text() == str(len(dropped))
    for row in page.locator("#rollout-table tbody tr").all():
        rid = row.get_attribute("data-rollout")
        assert row.locator("td.outcome").inner_text() == "dropped before training: constant-reward group"
        assert dropped[rid] == "constant_reward"
    page.goto(ui.url + "rollouts?outcome=trained&per_page=100")
    assert page.locator("#total").inner_text() == str(len(trained))
    shown = {r.get_attribute("data-rollout"): r.locator("td.outcome").inner_text()
             for r in page.locator("#rollout-table tbody tr").all()}  # fmt: skip
    assert shown == {rid: f"trained at step {min(steps)}" for rid, steps in trained.items()}
    steps = {r["step"] for r in read_metrics(run.log_dir)}
    assert {s for v in trained.values() for s in v} <= steps  # the numbering of the plots

    page.goto(ui.url + f"rollouts/{run.script_rollout}")
    assert page.locator("#fact-outcome").inner_text() == "dropped before training: constant-reward group"
    page.goto(ui.url + f"trajectory/{run.script_rollout}")
    assert int(page.locator("#sampled-count").inner_text()) > 0
    assert page.locator("#trained-count").inner_text() == "0"
    assert page.locator(".tokens .tok.trained").count() == 0
    assert "dropped: constant_reward" in page.locator(".seg-fate").first.inner_text()


def test_each_outcome_filter_and_a_stale_drop(run: Run, tmp_path: Path, page: Any) -> None:
    """A follow run's record of a stale drop (written with the trainer's own writer) reads as
    'dropped at step N: stale by k versions'; every outcome filter partitions the list."""
    live = tmp_path / "stale"
    shutil_copy(run, live)
    victim = next(o for o in outcomes(run) if o["outcome"] == "trained")["rollout_id"]
    lines = [o for o in outcomes(run) if o["rollout_id"] != victim]
    row = pa.table({"rollout_id": [victim], "agent_name": [None], "segment": [0]})
    lines += outcome_rows(row, "dropped", step=3, reason="stale", versions_behind=[2])
    (live / "train" / "outcomes.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    with UiServer([live], refresh_s=0.2) as server:
        page.goto(server.url + "rollouts?outcome=stale")
        assert page.locator("#total").inner_text() == "1"
        assert page.locator("td.outcome").inner_text() == "dropped at step 3: stale by 2 versions"
        totals = {}
        for outcome in ("trained", "stale", "constant_reward", "incomplete", "failed", "not_trained"):
            page.goto(server.url + f"rollouts?outcome={outcome}")
            totals[outcome] = int(page.locator("#total").inner_text())
        assert sum(totals.values()) == rollouts_made(run)
        page.goto(server.url + "rollouts?outcome=dropped")
        assert int(page.locator("#total").inner_text()) == totals["stale"] + totals["constant_reward"]


def test_plots_keep_each_metric_family_on_its_own_axis(run: Run, ui: UiServer, page: Any) -> None:
    """KL apart from entropy, the step's time apart from the run's, the learning rate apart from the
    batch index; every logged metric plotted once; legend numbers readable."""
    series = httpx.get(ui.url + "api/metrics").json()
    panel_of = {name: p["title"] for p in series["panels"] for name in p["names"]}
    logged = {k for r in read_metrics(run.log_dir) for k, v in r.items()
              if k != "step" and isinstance(v, int | float)}  # fmt: skip
    assert set(panel_of) == logged and sum(len(p["names"]) for p in series["panels"]) == len(logged)
    for a, b in (("optim/kl_sample_train_v1", "optim/entropy"), ("time/step", "time/total"),
                 ("optim/lr", "progress/batch"), ("progress/done_frac", "progress/batch")):  # fmt: skip
        assert panel_of[a] != panel_of[b], (a, b)
    page.goto(ui.url)
    kl = page.locator('.plot[data-title="KL, sampler vs trainer"]')
    kl.wait_for()
    assert kl.get_attribute("data-unit") == "nats"
    box = kl.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)  # the last step
    shown = kl.locator(".u-legend .u-series").nth(1).locator(".u-value").inner_text()
    last = read_metrics(run.log_dir)[-1]["optim/kl_sample_train_v1"]
    assert re.fullmatch(r"-?\d[\d.]*(e[-+]\d+)?", shown) and len(shown.replace("-", "")) <= 9, shown
    assert float(shown) == pytest.approx(last, rel=1e-3)


def test_a_run_logged_before_outcomes_jsonl_reads_its_checkpoints(
    run: Run, tmp_path: Path, page: Any
) -> None:
    """Without outcomes.jsonl the trained rollouts come from checkpoints.jsonl (no step recorded there)."""
    old = tmp_path / "old"
    shutil_copy(run, old)
    (old / "train" / "outcomes.jsonl").unlink()
    trained = {r for line in (run.log_dir / "checkpoints.jsonl").read_text().splitlines()
               for r in json.loads(line)["trained_rollout_ids"]}  # fmt: skip
    with UiServer([old], refresh_s=0.2) as server:
        page.goto(server.url + "rollouts?outcome=trained&per_page=100")
        assert page.locator("#total").inner_text() == str(len(trained))
        cells = set(page.locator("#rollout-table td.outcome").all_inner_texts())
        assert cells == {"trained (step not recorded)"}
        page.goto(server.url + f"trajectory/{run.split_rollout}")
        assert page.locator("#trained-count").inner_text() == page.locator("#sampled-count").inner_text()


def test_a_rollout_page_shows_its_training_outcome_live(run: Run, tmp_path: Path, page: Any) -> None:
    """The trainer records a step while the rollout page is open: its facts and group follow."""
    live = tmp_path / "live"
    shutil_copy(run, live)
    ledger = live / "train" / "outcomes.jsonl"
    lines = [o for o in outcomes(run) if o["rollout_id"] != run.split_rollout]
    ledger.write_text("".join(json.dumps(o) + "\n" for o in lines))
    with UiServer([live], refresh_s=0.2) as server:
        page.goto(server.url + f"rollouts/{run.split_rollout}")
        assert page.locator("#fact-outcome").inner_text() == "not trained"
        row = pa.table({"rollout_id": [run.split_rollout], "agent_name": [None], "segment": [0]})
        with ledger.open("a") as fh:
            fh.writelines(json.dumps(o) + "\n" for o in outcome_rows(row, "trained", step=7, tokens=[10]))
        page.wait_for_function("document.querySelector('#fact-outcome').textContent === 'trained at step 7'")
        here = page.locator("#group tr.here td.outcome")
        assert here.inner_text() == "trained at step 7"
