"""The Starlette app of ``tinkertrace ui``: read-only pages over a run's files, and their JSON.

Pages: run (metrics plots, settings), rollouts (paged, sortable, filtered), one rollout (span
timeline, messages, where each reward landed), one trajectory token by token, and the build report.
Every page re-checks the run's files (throttled), so a live run's new rollouts and steps appear; the
browser script polls ``/api/status`` and reloads the live parts when the data version moves.
Templates autoescape: nothing from a span is ever rendered as HTML. Handlers are plain functions:
Starlette runs them on its thread pool, so a page that builds a rollout never stalls the others.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tinkertrace import semconv as sc
from tinkertrace.builder.options import REWARD_POLICIES
from tinkertrace.ui.build_report import BuildReports
from tinkertrace.ui.built import (
    DEFAULT_POLICY,
    BuiltRollout,
    RolloutBuilds,
    agents_of,
    run_settings,
    token_view,
)
from tinkertrace.ui.compare import turn_pairs
from tinkertrace.ui.index import RunIndex
from tinkertrace.ui.listing import PAGE_SIZES, SORTABLE, RolloutPage, RolloutQuery
from tinkertrace.ui.outcomes import row_fates
from tinkertrace.ui.run_metrics import metric_series, version_series
from tinkertrace.ui.sources import not_span_files, read_json
from tinkertrace.ui.templating import template_environment
from tinkertrace.ui.timeline import messages_of, reward_landings, span_tree
from tinkertrace.ui.token_gate import TokenGate

HERE = Path(__file__).parent


@dataclass
class UiState:
    index: RunIndex
    builds: RolloutBuilds
    reports: BuildReports
    templates: jinja2.Environment


def environment_names(settings: dict[str, Any]) -> list[str]:
    """The environments a training config names (``environments: [{name: …}, …]``), else none."""
    envs = settings.get("environments")
    return (
        [str(e["name"]) for e in envs if isinstance(e, dict) and e.get("name")]
        if isinstance(envs, list)
        else []
    )


def _state(request: Request) -> UiState:
    state: UiState = request.app.state.ui
    state.index.refresh()
    return state


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    state: UiState = request.app.state.ui
    html = state.templates.get_template(template).render(
        request=request, version=state.index.version, nav=template.split(".")[0],
        missing_spans=state.index.missing_spans(), **context,
    )  # fmt: skip
    return HTMLResponse(html, status_code=status_code)


def _bad_request(request: Request, message: str) -> HTMLResponse:
    return _page(request, "error.html", status_code=400, title="bad request", message=message)


# --- run -------------------------------------------------------------------------------------------
def _by_version(index: RunIndex) -> list[dict[str, Any]]:
    return index.by_version(environment_names(run_settings(index)))


def run_page(request: Request) -> Response:
    state = _state(request)
    summaries = [read_json(p) for p in state.index.sources.summary_files]
    return _page(
        request,
        "run.html",
        counts=state.index.counts(),
        settings=run_settings(state.index),
        summary=summaries[0] if summaries else {},
        sources=state.index.sources.describe(),
        skipped=sorted(state.index.skipped.items()),
        by_version=_by_version(state.index),
        task_progress=state.index.task_progress(),
        not_spans=not_span_files(state.index.sources) if state.index.missing_spans() else [],
    )


def api_status(request: Request) -> Response:
    return JSONResponse(_state(request).index.counts())


def api_metrics(request: Request) -> Response:
    return JSONResponse(metric_series(_state(request).index.sources.log_dirs))


def api_reward_by_version(request: Request) -> Response:
    return JSONResponse(version_series(_by_version(_state(request).index)))


# --- rollouts --------------------------------------------------------------------------------------
# Every parameter the rollout list understands; any other is refused (a typo must not pass unseen).
LIST_PARAMS = (
    "sort", "order", "page", "per_page", "status", "split", "task", "agent", "q", "incomplete", "trained",
    "outcome", "version", "partial", "token",
)  # fmt: skip
MAX_PAGE = 10**9


def _flag(params: Any, name: str) -> bool | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def parse_query(params: Any) -> RolloutQuery:
    """A :class:`RolloutQuery` from URL parameters; ValueError naming the bad one."""
    unknown = sorted(set(params.keys()) - set(LIST_PARAMS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; known: {', '.join(LIST_PARAMS[:-2])}")

    def integer(name: str, default: int) -> int:
        raw = params.get(name) or str(default)
        if not raw.isdigit() or int(raw) > MAX_PAGE:
            low = 0 if name == "version" else 1
            raise ValueError(f"{name} must be a whole number from {low} to {MAX_PAGE}, got {raw!r}")
        return int(raw)

    order = params.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be asc or desc, got {order!r}")
    return RolloutQuery(
        sort=params.get("sort") or "start_ms",
        desc=order == "desc",
        page=integer("page", 1),
        per_page=integer("per_page", 50),
        status=params.get("status") or None,
        split=params.get("split") or None,
        task=params.get("task") or None,
        agent=params.get("agent") or None,
        text=params.get("q") or None,
        incomplete=_flag(params, "incomplete"),
        trained=_flag(params, "trained"),
        outcome=params.get("outcome") or None,
        version=integer("version", 0) if params.get("version") else None,
    )


def _list_page(request: Request) -> tuple[RolloutQuery, RolloutPage]:
    """The rollout list page the URL asks for; ValueError naming a bad parameter or a page past the end."""
    query = parse_query(request.query_params)
    page = _state(request).index.list_rollouts(query)
    if query.page > page.pages:
        raise ValueError(f"page {query.page} is past the last page ({page.pages}) of this list")
    return query, page


def _link(request: Request, **changes: Any) -> str:
    """The current URL with some query parameters changed (None removes one)."""
    params = dict(request.query_params)
    params.pop("partial", None)
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = str(value)
    return "?" + urlencode(params)


def rollouts_page(request: Request) -> Response:
    state = _state(request)
    try:
        _, page = _list_page(request)
    except ValueError as exc:
        return _bad_request(request, str(exc))
    template = "rollouts_table.html" if request.query_params.get("partial") else "rollouts.html"
    return _page(
        request,
        template,
        page=page,
        facets=state.index.facets(),
        sortable=SORTABLE,
        page_sizes=PAGE_SIZES,
        params=request.query_params,
        link=lambda **kw: _link(request, **kw),
    )


EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def export_rollouts(request: Request) -> Response:
    """``/export/rollouts.csv`` or ``.jsonl``: every rollout the list's filters match, in its order."""
    fmt = request.path_params["fmt"]
    if fmt not in EXPORT_TYPES:
        return JSONResponse({"error": f"export as csv or jsonl, not {fmt!r}"}, status_code=404)
    try:
        query = parse_query(request.query_params)
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    body = _state(request).index.export(query, fmt)
    disposition = f'attachment; filename="rollouts.{fmt}"'
    return Response(body, media_type=EXPORT_TYPES[fmt], headers={"content-disposition": disposition})


def api_rollouts(request: Request) -> Response:
    try:
        query, page = _list_page(request)
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    body = {"total": page.total, "page": query.page, "pages": page.pages, "rows": page.rows}
    return Response(json.dumps(body, default=str), media_type="application/json")


# --- one rollout -----------------------------------------------------------------------------------
def _built(request: Request, rollout_id: str) -> tuple[dict[str, Any], BuiltRollout, str]:
    state = _state(request)
    row = state.index.rollout(rollout_id)
    if row is None:
        raise HTTPException(404, f"no rollout {rollout_id!r} in this run")
    policy = request.query_params.get("policy") or DEFAULT_POLICY
    if policy not in REWARD_POLICIES:
        raise HTTPException(
            400, f"unknown reward policy {policy!r}; choose one of {', '.join(REWARD_POLICIES)}"
        )
    return row, state.builds.get(rollout_id, policy), policy


def rollout_page(request: Request) -> Response:
    rollout_id = request.path_params["rollout_id"]
    row, built, policy = _built(request, rollout_id)
    index = _state(request).index
    spans = index.spans_of(rollout_id)
    details = index.span_details(rollout_id, index.files_of([rollout_id]))
    tree = span_tree(spans)
    return _page(
        request,
        "rollout.html",
        rollout=row,
        built=built,
        policy=policy,
        policies=REWARD_POLICIES,
        tree=tree,
        messages=messages_of(spans, details),
        rewards=reward_landings(spans, built),
        agents=agents_of(built),
        group=index.group_rows(row["task_id"], rollout_id),
        types=sc,
    )


def compare_page(request: Request) -> Response:
    """``/compare?a=<rollout>&b=<rollout>``: two rollouts' calls side by side, divergence marked."""
    ids = [request.query_params.get(k) or "" for k in ("a", "b")]
    if not all(ids):
        return _bad_request(request, "compare needs two rollouts: ?a=<rollout id>&b=<rollout id>")
    index = _state(request).index
    sides, builds, policy = [], [], DEFAULT_POLICY
    for rid in ids:
        row, built, policy = _built(request, rid)
        messages = messages_of(index.spans_of(rid), index.span_details(rid, index.files_of([rid])))
        sides.append({"rollout": row, "built": built, "messages": messages})
        builds.append(built)
    return _page(request, "compare.html", sides=sides, turns=turn_pairs(*builds), policy=policy)


def _trajectory(request: Request) -> dict[str, Any]:
    """The trajectory the URL asks for: its rollout row, build, policy, agents, agent and token view."""
    rollout_id = request.path_params["rollout_id"]
    row, built, policy = _built(request, rollout_id)
    agents = agents_of(built)
    wanted = request.query_params.get("agent")
    agent = next((a for a in agents if (a or "") == (wanted or "")), agents[0] if agents else None)
    fates = row_fates(_state(request).index.cursor(), rollout_id)
    view = token_view(built, agent, fates) if agents else None
    return {"rollout": row, "built": built, "policy": policy, "agents": agents, "agent": agent, "view": view}


def trajectory_page(request: Request) -> Response:
    return _page(request, "trajectory.html", **_trajectory(request))


def api_trajectory(request: Request) -> Response:
    """A trajectory as JSON: every segment token by token (what the trajectory page shows)."""
    t = _trajectory(request)
    rollout_id = t["rollout"]["rollout_id"]
    body = {"rollout_id": rollout_id, "policy": t["policy"], "agent": t["agent"], "trajectory": t["view"]}
    return Response(
        json.dumps(body, default=_jsonable), media_type="application/json",
        headers={"content-disposition": f'inline; filename="trajectory-{rollout_id}.json"'},
    )  # fmt: skip


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


# --- build report ----------------------------------------------------------------------------------
def build_page(request: Request) -> Response:
    state = _state(request)
    policy = request.query_params.get("policy") or DEFAULT_POLICY
    if policy not in REWARD_POLICIES:
        return _bad_request(
            request, f"unknown reward policy {policy!r}; choose one of {', '.join(REWARD_POLICIES)}"
        )
    return _page(
        request,
        "build.html",
        report=state.reports.get(policy, str(run_settings(state.index).get("group_by", "task"))),
        problems=state.reports.problem_lists(),
        policy=policy,
        policies=REWARD_POLICIES,
        index=state.index,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    return _page(
        request, "error.html", status_code=exc.status_code, title=str(exc.status_code), message=exc.detail
    )


def create_app(index: RunIndex, *, token: str | None = None) -> Starlette:
    """The app over ``index`` (refreshed as pages are asked for); ``token`` guards every request."""
    index.refresh(force=True)
    routes = [
        Route("/", run_page),
        Route("/rollouts", rollouts_page),
        Route("/rollouts/{rollout_id:path}", rollout_page),
        Route("/trajectory/{rollout_id:path}", trajectory_page),
        Route("/compare", compare_page),
        Route("/build", build_page),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/api/status", api_status),
        Route("/api/metrics", api_metrics),
        Route("/api/reward_by_version", api_reward_by_version),
        Route("/api/rollouts", api_rollouts),
        Route("/api/trajectory/{rollout_id:path}", api_trajectory),
        Route("/export/rollouts.{fmt}", export_rollouts),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(TokenGate, token=token)],
        exception_handlers={HTTPException: _http_error},
    )
    app.state.ui = UiState(index, RolloutBuilds(index), BuildReports(index), template_environment())
    return app
