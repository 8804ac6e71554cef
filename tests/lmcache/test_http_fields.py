"""Scenario 5: kvcontroller's HTTP answers against LMCache 0.5.6's controller's, field by field,
for every endpoint both serve (lmcache/v1/api_server/__main__.py: /lookup, /clear, /pin,
/compress, /decompress, /move, /health, /check_finish, /query_instance, /query_worker_info;
lmcache/v1/internal_api_server/controller/: /controller/workers, /controller/key-stats), with the
same cluster behind each (`kvc` and `lmc`: kvnodes A and B and LMCache's worker W) and the same
requests in the same order.

Compared: the status code, and the set of JSON key paths (recursively; list elements merged as
`[]`) with each value's JSON type; values are not compared. Keys that are instance ids (e.g.
/lookup's layout_info) are replaced by the instance's role (<A>, <B>, <W>) first. The failure
message lists every difference; differences kvcontroller makes on purpose (documented in the
protocol reference or its source) are listed as such and do not fail the test.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import pytest

from lmc_procs import CHUNK_TOKENS, LOCATION, node_hashes, put, wait_held

# Requests whose answers kvcontroller changes on purpose: the request's name -> why.
DELIBERATE = {
    "POST /check_finish": "LMCache never implemented it and always answers 500 {\"detail\": \"\"} "
                          "(protocol reference §6 D13); kvcontroller reports the event's state",
    "POST /check_finish (unknown event)": "as above; kvcontroller: 404, unknown event_id",
    "POST /query_instance (unknown ip)": "LMCache fails its own response validation (500); "
                                         "kvcontroller answers 404 with a reason "
                                         "(http_api.cpp)",
    "POST /pin (unknown instance)": "LMCache's executor fails its equal-num_tokens assertion "
                                    "on an instance without workers (500, §6 D12); "
                                    "kvcontroller answers 404 naming the instance",
    "POST /clear (unknown instance)": "as /pin (unknown instance)",
    "POST /move (unknown destination)": "as /pin (unknown instance)",
}


def shape(value: Any, roles: Dict[str, str], path: str = "$",
          out: Optional[Dict[str, Tuple[str, Any]]] = None) -> Dict[str, Tuple[str, Any]]:
    """path -> (JSON type, an example value) for every value under `value`."""
    if out is None:
        out = {}
    kind = {dict: "object", list: "array", str: "string", bool: "bool", int: "int",
            float: "float", type(None): "null"}[type(value)]
    out.setdefault(path, (kind, value if kind != "object" else "{...}"))
    if isinstance(value, dict):
        for k, v in value.items():
            name = f"<{roles[k]}>" if k in roles else k
            shape(v, roles, f"{path}.{name}", out)
    elif isinstance(value, list):
        for v in value:
            shape(v, roles, f"{path}[]", out)
    return out


def example(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(name: str, kvc_answer: Tuple[int, Any], lmc_answer: Tuple[int, Any],
            kvc_roles: Dict[str, str], lmc_roles: Dict[str, str]) -> List[str]:
    """Every difference between the two answers to request `name`."""
    diffs = []
    (ks, kb), (ls, lb) = kvc_answer, lmc_answer
    if ks != ls:
        diffs.append(f"{name}: status kvcontroller {ks}, lmcache_controller {ls} "
                     f"(kvcontroller {example(kb)}; lmcache_controller {example(lb)})")
    if isinstance(kb, str) or isinstance(lb, str):
        if type(kb) is not type(lb):
            diffs.append(f"{name}: body kvcontroller {example(kb)}, lmcache_controller "
                         f"{example(lb)}")
        return diffs
    k, m = shape(kb, kvc_roles), shape(lb, lmc_roles)
    for path in sorted(set(m) - set(k)):
        diffs.append(f"{name}: {path} missing in kvcontroller (lmcache_controller: "
                     f"{m[path][0]} {example(m[path][1])})")
    for path in sorted(set(k) - set(m)):
        diffs.append(f"{name}: {path} only in kvcontroller ({k[path][0]} "
                     f"{example(k[path][1])}); lmcache_controller has none")
    for path in sorted(set(k) & set(m)):
        if k[path][0] != m[path][0]:
            diffs.append(f"{name}: {path} is {k[path][0]} {example(k[path][1])} in "
                         f"kvcontroller, {m[path][0]} {example(m[path][1])} in "
                         f"lmcache_controller")
    return diffs


def requests_for(cluster, tokens: List[int], unheld: List[int]) -> List[Tuple[str, str, str, Any]]:
    """(name, method, path, body): the same requests for either cluster, by role."""
    a, b, w = cluster.a.instance, cluster.b.instance, cluster.w.instance
    return [
        ("GET /controller/workers", "GET", "/controller/workers", None),
        ("GET /controller/workers?instance_id", "GET", f"/controller/workers?instance_id={a}",
         None),
        ("GET /controller/workers?instance_id&worker_id", "GET",
         f"/controller/workers?instance_id={a}&worker_id=0", None),
        ("GET /controller/workers (unknown instance)", "GET",
         "/controller/workers?instance_id=no-such-instance", None),
        ("GET /controller/workers (unknown worker)", "GET",
         f"/controller/workers?instance_id={a}&worker_id=7", None),
        ("GET /controller/key-stats", "GET", "/controller/key-stats", None),
        ("POST /lookup", "POST", "/lookup", {"tokens": tokens}),
        ("POST /lookup (unheld)", "POST", "/lookup", {"tokens": unheld}),
        ("POST /health (kvnode)", "POST", "/health", {"instance_id": a}),
        ("POST /health (LMCache worker)", "POST", "/health", {"instance_id": w}),
        ("POST /health (unknown instance)", "POST", "/health", {"instance_id": "no-such"}),
        ("POST /pin", "POST", "/pin", {"instance_id": a, "location": LOCATION,
                                       "tokens": tokens}),
        ("POST /query_worker_info", "POST", "/query_worker_info", {"instance_id": a}),
        ("POST /query_worker_info (all)", "POST", "/query_worker_info", {"instance_id": "all"}),
        ("POST /query_worker_info (worker_ids)", "POST", "/query_worker_info",
         {"instance_id": w, "worker_ids": [0]}),
        ("POST /query_worker_info (unknown instance)", "POST", "/query_worker_info",
         {"instance_id": "no-such"}),
        ("POST /query_instance", "POST", "/query_instance", {"event_id": "q", "ip": "127.0.0.1"}),
        ("POST /query_instance (unknown ip)", "POST", "/query_instance",
         {"event_id": "q", "ip": "127.0.0.2"}),
        ("POST /move", "POST", "/move", {"old_position": [a, LOCATION],
                                         "new_position": [b, LOCATION], "tokens": tokens,
                                         "should_copy": True}),
        ("POST /check_finish", "POST", "/check_finish", {"event_id": "<the move's event_id>"}),
        ("POST /check_finish (unknown event)", "POST", "/check_finish", {"event_id": "no-such"}),
        ("POST /move (unknown destination)", "POST", "/move",
         {"old_position": [a, LOCATION], "new_position": ["no-such", LOCATION],
          "tokens": tokens}),
        ("POST /pin (unknown instance)", "POST", "/pin",
         {"instance_id": "no-such", "location": LOCATION, "tokens": tokens}),
        ("POST /clear (unknown instance)", "POST", "/clear",
         {"instance_id": "no-such", "location": LOCATION}),
        ("POST /compress (LMCache worker)", "POST", "/compress",
         {"instance_id": w, "method": "cachegen", "location": LOCATION, "tokens": tokens}),
        ("POST /decompress (LMCache worker)", "POST", "/decompress",
         {"instance_id": w, "method": "cachegen", "location": LOCATION, "tokens": tokens}),
        ("POST /clear", "POST", "/clear", {"instance_id": b, "location": LOCATION}),
    ]


def ask(cluster, tokens, unheld) -> Dict[str, Tuple[int, Any]]:
    answers: Dict[str, Tuple[int, Any]] = {}
    c = cluster.controller
    for name, method, path, body in requests_for(cluster, tokens, unheld):
        if name == "POST /check_finish":
            move = answers["POST /move"][1]
            body = {"event_id": move.get("event_id", "none") if isinstance(move, dict) else "x"}
        answers[name] = c.get(path) if method == "GET" else c.post(path, body, timeout=120)
    return answers


def prepare(cluster, tokens):
    """A holds `tokens` (3 chunks) and the controller's registry knows it."""
    assert put(cluster.a, tokens[0], len(tokens), seed=31)["chunks"] == 3
    wait_held(cluster.controller, cluster.a.instance, node_hashes(tokens))


def report(diffs: List[str]) -> Tuple[List[str], List[str]]:
    """(differences to fix, deliberate ones with their reason once per request)."""
    other = [d for d in diffs if not any(d.startswith(n + ":") for n in DELIBERATE)]
    deliberate = []
    for name, why in DELIBERATE.items():
        mine = [d for d in diffs if d.startswith(name + ":")]
        if mine:
            deliberate += mine + [f"{name}: deliberate: {why}"]
    return other, deliberate


def test_answers_have_the_same_fields(kvc, lmc, fresh_tokens):
    tokens = fresh_tokens(3 * CHUNK_TOKENS)
    unheld = fresh_tokens(CHUNK_TOKENS)
    prepare(kvc, tokens)
    prepare(lmc, tokens)
    kvc_answers = ask(kvc, tokens, unheld)
    lmc_answers = ask(lmc, tokens, unheld)
    diffs = []
    for name in kvc_answers:
        diffs += compare(name, kvc_answers[name], lmc_answers[name], kvc.roles, lmc.roles)
    other, deliberate = report(diffs)
    print("\n".join(["field differences:"] + (other or ["(none)"]) + deliberate))
    assert not other, (f"{len(other)} difference(s) between kvcontroller's and LMCache "
                       "0.5.6's HTTP answers:\n  " + "\n  ".join(other) +
                       ("\nand deliberate ones:\n  " + "\n  ".join(deliberate)
                        if deliberate else ""))


@pytest.mark.parametrize("name,path,body", [
    ("POST /lookup (no tokens)", "/lookup", {}),
    ("POST /lookup (tokens not a list)", "/lookup", {"tokens": "1,2"}),
    ("POST /pin (no location)", "/pin", {"instance_id": "x", "tokens": [1]}),
    ("POST /move (bad position)", "/move", {"old_position": ["x"], "new_position": ["y", "z"]}),
    ("POST /health (no instance_id)", "/health", {}),
])
def test_validation_errors_have_the_same_fields(kvc, lmc, name, path, body):
    """A malformed request: both answer FastAPI's 422 {"detail": [{"type", "loc", "msg",
    "input"}...]} (kvcontroller names the first bad field; pydantic lists them all)."""
    k = kvc.controller.post(path, body)
    m = lmc.controller.post(path, body)
    assert m[0] == 422, f"LMCache's controller answered {m}"
    diffs = compare(name, k, m, kvc.roles, lmc.roles)
    assert not diffs, "\n".join(diffs)
    assert [e["type"] for e in k[1]["detail"]] == [e["type"] for e in m[1]["detail"]][:1]
    assert [e["loc"] for e in k[1]["detail"]] == [e["loc"] for e in m[1]["detail"]][:1]
