"""state: show and initialise the JSON state file every vkit tool shares.

Sits at the start of every pipeline: ``state init`` records the service and how to
launch it; ``state show`` tells what is kept, what is being tried, who holds the
lease and whether the environment is ABNORMAL. The only two writes a human needs
(``--clear-abnormal``, ``--break-lease``) are here and are logged.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time

from vkit.apply import slots
from vkit.apply.launcher import serve_argv
from vkit.apply.policy import parse_assignments, render_table, to_serve_flags
from vkit.cli._common import IO, add_subcommand, load_policy, make_parser, run
from vkit.errors import ExitCode, UsageError, VkitError
from vkit.measure.fingerprint import fingerprint
from vkit.state import StateFile, lease_staleness, new_state

TOOL = "state"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Show and initialise the vkit state file (service, kept configuration, lease, trials).",
        examples=[
            "state init --url http://127.0.0.1:8000 --model sim-8b -- bin/sim_server sim-8b --port 8000",
            "state init --url http://127.0.0.1:8000 --model /models/x --set max_num_seqs=64 -- vllm serve /models/x --port 8000",
            "state show            # kept config as vllm serve flags, lease, ABNORMAL, last trials",
            "state show --json | jq .kept",
            "state history -n 20",
            "state --clear-abnormal --reason 'driver reloaded, server healthy again'",
            "state --break-lease   # only when the run holding it is dead",
            "state init --slots 4 --url http://127.0.0.1:8000 --model m -- vllm serve m --port 8000 -tp 2   # 4 slots of 2 devices",
            "state --slot-in s1 --reason 'GPU 2 reseated'   # a slot taken out serves trials again",
        ],
        exit_notes={1: "state init refused by the parameter policy", 4: "no state file (run state init)"},
    )
    p.add_argument("--clear-abnormal", action="store_true", help="clear the ABNORMAL flag after a human fixed the cause (logged)")
    p.add_argument("--break-lease", action="store_true", help="remove the lease of a dead run (logged)")
    p.add_argument("--slot-in", metavar="NAME", help="put a slot that was taken out back into service (logged)")
    p.add_argument("--reason", default="", help="why, for the decision log (used with --clear-abnormal / --break-lease)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    s = add_subcommand(sub, "show", "show the state (default command)")
    s.add_argument("-n", "--trials", type=int, default=5, metavar="N", help="number of last trials to list (default 5)")
    i = add_subcommand(
        sub,
        "init",
        "record the service and the argv that launches it",
        description="Record the service and how to launch it. Everything after -- is the launch argv, stored as a list.",
        examples=["state init --url http://127.0.0.1:8000 --model sim-8b -- bin/sim_server sim-8b --port 8000"],
    )
    i.add_argument("--model", required=True, help="served model name the service must answer to")
    i.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V", help="initial kept configuration (vLLM names), repeatable")
    i.add_argument("--force", action="store_true", help="replace an existing state file (the old one is kept as .bak)")
    i.add_argument("--allow", action="append", default=[], metavar="PARAM", help="override the policy's refusal for PARAM (logged), repeatable")
    i.add_argument("--stop-hook", metavar="JSON", help="hook mode (systemd, docker): a JSON list, the argv that stops the server; "
                   "the argv after -- is then the start hook, which receives the flags in $VKIT_SERVE_FLAGS(_FILE)")
    g = i.add_argument_group("slots (several accelerator groups of one machine, one server each: runbook/state.md#slots)")
    g.add_argument("--slots", type=int, default=None, metavar="N",
                   help="N slots, each its own server on its own devices and port (default: none, the service alone)")
    g.add_argument("--devices-per-slot", type=int, default=None, metavar="G",
                   help="accelerators a slot holds, consecutive ids from 0 (default: the launch argv's tensor x pipeline parallel size)")
    g.add_argument("--slots-file", metavar="FILE",
                   help='the slots as JSON: [{"name": "s0", "devices": [0, 1], "port": 8000}, ...] (an "argv_extra" list '
                        "adds launch arguments for that slot only)")
    g.add_argument("--visible-devices-var", default=None, metavar="VAR",
                   help="the variable that gives a server its devices (default from the accelerator found: "
                        "CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES)")
    i.add_argument("launch", nargs="*", metavar="-- SERVE ARGV", help="command that starts the server, e.g. -- vllm serve /models/x --port 8000")
    h = add_subcommand(sub, "history", "list the decision log")
    add_subcommand(
        sub,
        "policy",
        "print the parameter policy (the runbook's traffic-light table); --json for the data",
        examples=["state policy", "state policy --json | jq '.forbidden[].param'"],
    )
    h.add_argument("-n", "--last", type=int, default=0, metavar="N", help="only the last N events (default all)")
    return p


def _run(args: argparse.Namespace, io: IO) -> int:
    sf = StateFile(args.state)
    if args.clear_abnormal or args.break_lease or args.slot_in:
        if args.cmd not in (None, "show"):
            raise UsageError("--clear-abnormal, --break-lease and --slot-in cannot be combined with a command")
        return _human_writes(sf, args, io)
    cmd = args.cmd or "show"
    if cmd == "init":
        return _init(sf, args, io)
    if cmd == "history":
        return _history(sf, args, io)
    if cmd == "policy":
        policy = load_policy()
        if args.json:
            io.emit_json(policy.data)
        else:
            io.out.write(render_table(policy))
        return ExitCode.OK
    return _show(sf, args, io)


def _human_writes(sf: StateFile, args: argparse.Namespace, io: IO) -> int:
    if args.clear_abnormal:
        ab, did = sf.service.clear_abnormal(TOOL, args.reason)
        if ab is None:
            io.progress("environment is not ABNORMAL; nothing to clear")
        else:
            io.progress(f"ABNORMAL cleared ({did}); was: {ab.get('reason')}")
    if args.break_lease:
        lease, stale, did = sf.leases.force_break(TOOL, args.reason)
        if lease is None:
            io.progress("no lease is held; nothing to break")
        elif stale is None:
            io.warn(f"the lease of {lease.get('owner')} looked live (pid {lease.get('pid')}); broken anyway ({did})")
        else:
            io.progress(f"lease of {lease.get('owner')} broken ({stale}; {did})")
    if args.slot_in:
        was = sf.slots.put_in(args.slot_in)
        did = sf.log.append(TOOL, "slot_in", slot=args.slot_in, was=was, reason=args.reason, by="human")
        slot = next(s for s in sf.read()["slots"] if s["name"] == args.slot_in)
        ab, _ = StateFile(os.path.join(sf.dir, slot["state"])).service.clear_abnormal(TOOL, args.reason or f"slot back in service ({did})")
        if ab is not None:
            io.progress(f"slot {args.slot_in}: its ABNORMAL cleared; was: {ab.get('reason')}")
        io.progress(f"slot {args.slot_in} " + (f"back in service ({did}); was out: {was.get('reason')}" if was else "was in service"))
    return ExitCode.OK


def _init(sf: StateFile, args: argparse.Namespace, io: IO) -> int:
    if not args.url:
        raise UsageError("state init needs --url URL (the server's base URL)")
    if not args.launch:
        raise UsageError("state init needs the launch argv after --, e.g. -- vllm serve /models/x --port 8000")
    policy = load_policy()
    kept = parse_assignments(args.sets, policy)
    overrides = policy.check_change(kept, allow=args.allow)
    launch = None
    if args.stop_hook:
        try:
            stop = json.loads(args.stop_hook)
        except ValueError:
            raise UsageError("--stop-hook takes a JSON list, e.g. '[\"systemctl\", \"stop\", \"vllm\"]'") from None
        if not (isinstance(stop, list) and stop and all(isinstance(x, str) for x in stop)):
            raise UsageError("--stop-hook takes a non-empty JSON list of strings (an argv, never a shell string)")
        launch = {"mode": "hooks", "start_hook": list(args.launch), "stop_hook": stop, "argv": []}
    fp = fingerprint(args.model, args.launch)
    did = sf.log.new_id()
    url = args.url.rstrip("/")
    slot_list = _slot_list(args, url, fp)
    doc = new_state(url, args.model, args.launch, kept, launch=launch, fingerprint=fp, decision_id=did, slots=slot_list)
    sf.create(doc, force=args.force)
    for s in slot_list or []:
        sub = StateFile(os.path.join(sf.dir, s["state"]))
        sub.create(new_state(s["url"], args.model, [], kept, launch=s["launch"], fingerprint=fp, decision_id=did), force=args.force)
        sub.log.append(TOOL, "init", decision_id=did, url=s["url"], model=args.model, slot=s["name"], launch=s["launch"], kept=kept)
    sf.log.append(TOOL, "init", decision_id=did, url=url, model=args.model, launch_argv=args.launch, kept=kept, overrides=overrides,
                  slots=slot_list)
    io.progress(f"state written to {sf.path} ({did})"
                + (f"; {len(slot_list)} slots: " + ", ".join(f"{s['name']} devices {','.join(map(str, s['devices']))} "
                                                              f"port {s['port']}" for s in slot_list) if slot_list else ""))
    if args.json:
        io.emit_json(sf.read())
    return ExitCode.OK


def _slot_list(args: argparse.Namespace, url: str, fp: dict) -> list[dict] | None:
    """The slots of ``state init`` (--slots N or --slots-file), each with its URL, launch and state file."""
    if args.slots is None and not args.slots_file:
        if args.devices_per_slot is not None:
            raise UsageError("--devices-per-slot needs --slots N")
        return None
    if args.slots is not None and args.slots_file:
        raise UsageError("give the slots either as --slots N or as --slots-file FILE, not both")
    listed = slots.load_file(args.slots_file) if args.slots_file else slots.plan(args.slots, args.launch, url, args.devices_per_slot)
    slots.check(listed)
    var = args.visible_devices_var or slots.visible_var((fp.get("accelerator") or {}).get("kind"))
    base = {"mode": "argv", "argv": list(args.launch)}
    if args.stop_hook:
        base = {"mode": "hooks", "start_hook": list(args.launch), "stop_hook": json.loads(args.stop_hook), "argv": []}
    out = []
    for s in listed:
        rel = os.path.relpath(slots.state_path(".", s["name"]), ".")
        out.append(dict(s, devices=list(s["devices"]), url=slots.url_with_port(url, s["port"]), visible_devices_var=var,
                        state=rel, launch=slots.launch_for(base, s, var)))
    return out


def _history(sf: StateFile, args: argparse.Namespace, io: IO) -> int:
    sf.read()  # missing or corrupted state is reported the same way as for show
    events = sf.log.read()
    if args.last > 0:
        events = events[-args.last :]
    for e in events:
        if args.json:
            io.emit_line(e)
        else:
            extra = {k: v for k, v in e.items() if k not in ("ts", "id", "tool", "event", "vkit_version")}
            io.out.write(f"{e.get('ts')}  {e.get('id')}  {e.get('tool'):<22} {e.get('event'):<20} {_brief(extra)}\n")
    return ExitCode.OK


def _brief(d: dict, limit: int = 120) -> str:
    s = " ".join(f"{k}={v}" for k, v in d.items())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def serve_view(st: dict) -> dict:
    kept = st["kept"]["config"]
    flags = to_serve_flags(kept)
    return {"kept_flags": flags, "serve_command": shlex.join(serve_argv(st["service"]["launch"], kept))}


def _show(sf: StateFile, args: argparse.Namespace, io: IO) -> int:
    st = sf.read()
    view = serve_view(st)
    if args.json:
        io.emit_json({**st, **view})
        return ExitCode.OK
    svc = st["service"]
    w = io.out.write
    w(f"state file   {sf.path}\n")
    run_ = svc.get("running") or {}
    w(f"service      {svc['model']} at {svc['url']}" + (f" (pid {run_['pid']}, {run_.get('role')} config)" if run_.get("pid") else "") + "\n")
    kept = st["kept"]
    kept_txt = " ".join(f"{k}={v}" for k, v in sorted(kept["config"].items())) or "(launch defaults)"
    w(f"kept         {kept_txt}   [decision {kept.get('decision_id')}]\n")
    w(f"kept flags   {' '.join(view['kept_flags']) or '(none)'}\n")
    w(f"deploy       {view['serve_command']}\n")
    cand = st.get("candidate")
    w(f"candidate    {' '.join(f'{k}={v}' for k, v in sorted(cand['config'].items())) if cand else 'none'}\n")
    frozen = st.get("frozen") or {}
    if frozen:
        w(f"frozen       {' '.join(f'{k}={v}' for k, v in sorted(frozen.items()))}\n")
    for s in st.get("slots") or []:
        sub = _slot_view(sf, s)
        w(f"slot {s['name']:<7} devices {','.join(map(str, s['devices']))} port {s['port']}: "
          + (f"OUT since {s['out'].get('since')}: {s['out'].get('reason')}" if s.get("out") else "in service")
          + (f"; ABNORMAL: {sub['abnormal']}" if sub.get("abnormal") else "")
          + (f"; pid {sub['pid']} ({sub['role']} config)" if sub.get("pid") else "") + "\n")
    w(f"machine      {st.get('machine_state')}; consecutive start failures {st.get('start_failures', 0)}\n")
    lease = st.get("lease")
    if lease:
        stale = lease_staleness(lease)
        left = int(lease.get("expires", 0) - time.time())
        w(f"lease        held by {lease['owner']} (pid {lease.get('pid')}), " + (f"STALE: {stale}" if stale else f"expires in {left}s") + "\n")
    else:
        w("lease        free\n")
    ab = st.get("abnormal") or {}
    w(f"ABNORMAL     {'YES since ' + str(ab.get('since')) + ': ' + str(ab.get('reason')) if ab.get('flag') else 'no'}\n")
    sig = st.get("sigma_baseline") or {}
    if sig:
        w("sigma        " + " ".join(f"{k}={v:.2%}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in sorted(sig.items())) + "\n")
    for m, comp in sorted((st.get("sigma_components") or {}).items()):
        if comp.get("between") is not None:
            w(f"  {m}: within one process {comp['within']:.2%}, between restarts {comp['between']:.2%} "
              f"({comp.get('runs')} runs on {comp.get('groups')} starts)\n")
    tune = st.get("tune") or {}
    timing = st.get("timing") or {}
    if timing:
        w("time         " + ", ".join(f"{v.get('n')} {k}s {v.get('s', 0) / 60:.1f} min" for k, v in sorted(timing.items())) + "\n")
    eta = tune.get("eta")
    if eta and not tune.get("finished"):
        w(f"ETA          step {eta.get('step')}: about {eta.get('seconds', 0) / 60:.1f} min from {eta.get('at')} "
          f"({eta.get('candidates_left')} candidate(s) left at most, then its confirmation)\n")
    trials = st.get("trials") or []
    w(f"trials       {len(trials)} recorded" + (f", last {min(getattr(args, 'trials', 5), len(trials))}:" if trials else "") + "\n")
    n_last = getattr(args, "trials", 5)
    for t in trials[-n_last:] if n_last > 0 else []:
        cfg = " ".join(f"{k}={v}" for k, v in sorted((t.get("config") or {}).items()))
        w(f"  {t.get('id', '?'):<10} {cfg:<48} valid={t.get('valid')} verdict={t.get('verdict')}\n")
    return ExitCode.OK


def _slot_view(sf: StateFile, slot: dict) -> dict:
    try:
        sub = StateFile(os.path.join(sf.dir, slot["state"])).read()
    except VkitError:  # a slot's file that cannot be read is shown as such, never fails `state show`
        return {"abnormal": "its state file cannot be read"}
    run_ = sub["service"].get("running") or {}
    ab = sub.get("abnormal") or {}
    return {"abnormal": ab.get("reason") if ab.get("flag") else None, "pid": run_.get("pid"), "role": run_.get("role")}


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
