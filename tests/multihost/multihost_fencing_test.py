"""Partitions and fencing across hosts: a worker cut off from the coordinator kills its
ranks before the coordinator restarts them elsewhere, and a coordinator outage kills
nothing. Each case on hosts of its own (tests/multihost/netns.py):

    python3 tests/multihost/multihost_fencing_test.py BIN_DIR SOURCE_DIR [CASE...]

CASE (default all): `control` (w2 cut from the coordinator's port only; the workers
still reach each other), `oneway` (what w2 sends the coordinator's host is lost; the
other way flows), `isolated` (w2 cut from everyone), `outage` (the coordinator killed,
back after 6 s), `data` (w2 cut from w1 only, both still reaching the coordinator).

A coordinator (h0) and two workers of two slots (w1, w2) run two 2-node jobs: the
built-in trainer with checkpoints in one shared directory, and a command job printing
a numbered line every 100 ms; then a spare worker (w3) joins and w2 is cut off. Checked:
- both jobs SUCCEED (a partition: restarted on w1 and w3; an outage: attempt 1 goes on);
- never two live processes of one rank of a job, sampled every 50 ms from /proc;
- the shared directory's newest checkpoint never goes back;
- a partition: w2's ranks are gone before the coordinator declares w2 lost, w2's log
  says why, and once healed w2 is back within seconds and its orphan's last line (the
  command job's, numbered in a file as well) reaches `ddpctl logs`;
- an outage: w2's log says the other workers lost the coordinator too, nothing is fenced;
- a data-plane cut: nobody fences; the built-in job's ranks, whose collectives hang, are
  failed by the coordinator's stall watchdog (train.stall_timeout_s 5 there) and the job
  restarts (healed once it has); the command job, whose ranks never talk, goes on.
Prints each case's timings: lost declared after N s, ranks fenced after M s, the
restart's first step after K s. Skips (exit 77) where namespaces cannot be made.
"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks, DdpOnHosts, Watch  # noqa: E402
from netns import SKIP, Hosts  # noqa: E402

bindir, source = (os.path.abspath(a) for a in sys.argv[1:3])
cases = sys.argv[3:] or ["control", "oneway", "isolated", "outage", "data"]
why = Hosts.unavailable() or Hosts.no_iptables()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
check = Checks()
OUTAGE_S = 6.0
# The coordinator's default heartbeat timeout: declared lost after it (and a tick).
HEARTBEAT_TIMEOUT_S = 2.5

TICKER = """import os, sys, time
rank, attempt = int(os.environ["RANK"]), os.environ["DDP_ATTEMPT"]
for step in range(int(sys.argv[2])):
    print("rank %d attempt %s line %d" % (rank, attempt, step), flush=True)
    with open(os.path.join(sys.argv[1], "last-a%s-r%d" % (attempt, rank)), "w") as f:
        f.write(str(step))
    time.sleep(0.1)
"""


def write_jobs(tmp, stall_timeout_s=0):
    data = os.path.join(source, "data", "breast_cancer.csv")
    ckpt = os.path.join(tmp, "ckpt")
    builtin = os.path.join(tmp, "builtin.yaml")
    with open(builtin, "w") as f:
        f.write("name: fenced\nnodes: 2\nnproc_per_node: 1\nmax_restarts: 2\n"
                "model: {mlp: {hidden: [256, 256]}}\n"
                "data: {csv: {path: %s, skip_rows: 1, label_column: -1, standardize: true}}\n"
                "train: {epochs: 30, batch_size: 8, optimizer: {name: adam, lr: 0.001},\n"
                "        stall_timeout_s: %d}\n"
                "checkpoint: {dir: \"%s\", every_steps: 10}\n" % (data, stall_timeout_s, ckpt))
    lines = os.path.join(tmp, "lines")
    os.makedirs(lines)
    with open(os.path.join(tmp, "ticker.py"), "w") as f:
        f.write(TICKER)
    command = os.path.join(tmp, "command.yaml")
    with open(command, "w") as f:
        f.write("name: ticker\nnodes: 2\nnproc_per_node: 1\nmax_restarts: 2\n"
                "command: [/usr/bin/python3, %s, %s, \"150\"]\n"
                % (os.path.join(tmp, "ticker.py"), lines))
    return builtin, command, ckpt, lines


def check_partition(case, ddp, jobs, watch, w2_log, lines, lost_at, fenced, back, first_step):
    reason = ("answers either: this worker is cut off" if case == "isolated"
              else "still reaches the coordinator")
    check(reason in w2_log, "%s: w2's log says why it fenced: ...%s..." % (case, reason))
    check(lost_at is not None and fenced is not None and fenced < lost_at,
          "%s: w2's ranks gone %.2f s after the cut, before w2 was declared lost at %.2f s"
          % (case, fenced or -1, lost_at or -1))
    check(back is not None and back < 10,
          "%s: w2 back %.1f s after the heal" % (case, back if back is not None else -1))
    check("reachable again" in open(ddp.log_path("w2")).read(),
          "%s: w2's log says the coordinator is reachable again" % case)
    # The orphan's last line: the command job's rank on w2 in attempt 1.
    rank = next(r for _, ranks, _ in watch.samples for (job, r), procs in ranks.items()
                if job == jobs[1] and any(a == 1 and n == "w2" for _, a, n in procs))
    with open(os.path.join(lines, "last-a1-r%d" % rank)) as f:
        want = "rank %d attempt 1 line %s" % (rank, f.read().strip())
    got = ""
    t0 = time.time()
    while want not in got and time.time() - t0 < 20:
        got = ddp.ctl(0, "logs", jobs[1], "--rank", str(rank), check=False) or ""
        time.sleep(0.5)
    check(want in got, "%s: the orphan's last line reached ddpctl logs: %r" % (case, want))
    print("%s: lost declared after %.2f s, ranks fenced after %.2f s, the restart's first "
          "step after %s s" % (case, lost_at or -1, fenced or -1,
                               "%.2f" % first_step if first_step else "?"), flush=True)


def run_case(case, tmp):
    print("== %s" % case, flush=True)
    builtin, command, ckpt, lines = write_jobs(tmp, 5 if case == "data" else 0)
    with Hosts(4) as hosts:
        ddp = DdpOnHosts(hosts, bindir, tmp, workers={1: "w1", 2: "w2"},
                         coordinator_args=("--command-jobs", "users"),
                         worker_args=("--slots", "2", "--allow-exec", "/usr/bin/python3"))
        ddp.wait_listening(0)
        ddp.wait_workers(0, ["w1", "w2"])
        jobs = [ddp.submit(0, builtin), ddp.submit(0, command)]
        watch = Watch(jobs, [ckpt])
        deadline = time.time() + 60
        while {(j, r) for j in jobs for r in (0, 1)} - set(watch.samples[-1][1] if watch.samples
                                                           else {}):
            if time.time() > deadline:
                raise RuntimeError("the jobs did not start: %s" % watch.samples[-1:])
            time.sleep(0.2)
        # The spare joins once both jobs are placed on w1 and w2.
        ddp.start_worker(3, "w3")
        ddp.wait_workers(0, ["w1", "w2", "w3"])
        # The cut once the built-in job trains: its first step event arms the stall watch
        # (before it, start-up is the start timeout's and rdzv.timeout_s's to bound, see
        # coordinator/core/stall_watchdog.h); on a loaded machine its ranks can take longer
        # than the spare's start to get there.
        deadline = time.time() + 60
        while not any(m.get("attempt", 1) == 1 for m in ddp.job(0, jobs[0]).get("metrics", [])):
            if time.time() > deadline:
                raise RuntimeError("the built-in job reported no step in 60 s: %s"
                                   % ddp.job(0, jobs[0]))
            time.sleep(0.2)
        time.sleep(2)

        t_cut = time.time()
        if case == "control":
            hosts.partition(2, 0, port=7700)
        elif case == "oneway":
            hosts.drop(2, 0)
        elif case == "isolated":
            hosts.cut(2)
        elif case == "data":
            hosts.partition(2, 1)
        else:
            ddp.kill_coordinator()
        lost_at = first_step = back = failed_at = None
        ended = {}
        while len(ended) < len(jobs) and time.time() - t_cut < 120:
            if case == "outage" and ddp.coordinator_proc.poll() is not None:
                if time.time() - t_cut >= OUTAGE_S:
                    ddp.start_coordinator()
                    ddp.wait_listening(0)
                time.sleep(0.1)
                continue
            alive = ddp.alive(0)
            if lost_at is None and alive is not None and "w2" not in alive:
                lost_at = time.time() - t_cut
            for job in jobs:
                j = ddp.job(0, job)
                if case == "data" and job == jobs[0] and failed_at is None and \
                        len(j.get("attempts", [])) >= 2:
                    failed_at = time.time() - t_cut
                    hosts.heal_links()
                if first_step is None and job == jobs[0] and any(
                        m.get("attempt", 1) >= 2 for m in j.get("metrics", [])):
                    first_step = time.time() - t_cut
                if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    ended[job] = j
            time.sleep(0.2)
        if case not in ("outage", "data"):
            if case == "isolated":
                hosts.heal(2)
            else:
                hosts.heal_links()
            t_heal = time.time()
            back = None
            while time.time() - t_heal < 30:
                if "w2" in (ddp.alive(0) or ()):
                    back = time.time() - t_heal
                    break
                time.sleep(0.1)
        watch.stop()

        for job in jobs:
            j = ended.get(job) or ddp.job(0, job)
            check(j["state"] == "SUCCEEDED", "%s: %s %s after %d attempt(s): %s" % (
                case, j["name"], j["state"], len(j.get("attempts", [])), j.get("reason", "")))
        check(watch.doubles() == [], "%s: never two live processes of one rank (%d samples)%s" % (
            case, len(watch.samples), "" if not watch.doubles() else ": %s" % watch.doubles()[:3]))
        check(watch.backwards() == [], "%s: the newest checkpoint never went back%s" % (
            case, "" if not watch.backwards() else ": %s" % watch.backwards()[:3]))
        w2_log = open(ddp.log_path("w2")).read()
        on_w2 = watch.last_seen(lambda job, rank, attempt, node: node == "w2" and attempt == 1)
        fenced = None if on_w2 is None else on_w2 + 0.05 - t_cut
        if case == "data":
            first = ended.get(jobs[0], {}).get("attempts", [{}])[0]
            check("stalled: no progress" in first.get("reason", ""),
                  "data: the built-in job's attempt 1 failed %.1f s after the cut: %s"
                  % (failed_at or -1, first.get("reason")))
            check("no heartbeat through" not in w2_log, "data: nobody lost the coordinator")
            check(len(ended.get(jobs[1], {}).get("attempts", [])) == 1,
                  "data: the command job went on in its first attempt")
            print("data: the stall watchdog failed the attempt after %.1f s; the restart's "
                  "first step after %s s" % (failed_at or -1,
                                             "%.2f" % first_step if first_step else "?"))
        elif case == "outage":
            said = [line for line in w2_log.splitlines() if "no heartbeat through" in line]
            check(len(said) == 1 and "lost the coordinator too" in said[0],
                  "outage: w2 asked the others, who lost the coordinator too, and fenced "
                  "nothing: %s" % said)
            check(all(len(ended[j].get("attempts", [])) == 1 for j in ended),
                  "outage: both jobs went on in their first attempt")
            print("outage: %.0f s without a coordinator; the jobs went on" % OUTAGE_S)
        else:
            check_partition(case, ddp, jobs, watch, w2_log, lines, lost_at, fenced, back,
                            first_step)
    check(hosts.leftovers() == [], "%s: no namespace left behind" % case)


for case in cases:
    tmp = tempfile.mkdtemp(prefix="ddp-fencing-%s-" % case)
    try:
        run_case(case, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
check.exit()
