"""Issue 38 (1): tfaccel's SLURM parser against SLURM itself.

Host lists: ``tfaccel.cluster.expand_nodelist`` against ``scontrol show hostnames`` (SLURM's own expansion) on many
shapes. Placement: real ``srun`` steps on the two-node partition ``multi`` (node9, node10; both this host, see
scripts/local_slurm.sh), block and cyclic, each task comparing the node and port tfaccel gives its rank with the
node SLURM ran it on (``SLURMD_NODENAME``). Nothing here trains (node9/node10 do not resolve), so no TensorFlow.
"""

import json
from pathlib import Path

import pytest

from tfaccel.cluster import expand_nodelist

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_slurm.sh"
SHAPES = ["n[001-010]", "node[9-10]", "a[1-3,5],b7", "node[8-11],login1", "rack[1-2]-n[01-02]", "x[0-3,10-11]",
          "gpu[099-101]", "c1,c10,c2", "host", "a[9-10]b[1-2]", "sys[00007-00009]"]


def test_expand_nodelist_matches_scontrol_show_hostnames(slurm) -> None:
    for shape in SHAPES:
        out = slurm.run(["scontrol", "show", "hostnames", shape], timeout=30)
        assert out.returncode == 0, (shape, out.stderr)
        assert expand_nodelist(shape) == out.stdout.split(), shape


def test_a_suffix_after_the_last_bracket_is_refused_by_slurm_but_read_by_tfaccel(slurm) -> None:
    """SLURM 22.05 refuses ``n[1-2]-ib`` ("Invalid hostlist", no host printed), so no srun step ever has it; tfaccel reads it as the
    text says (``n1-ib n2-ib``), like ``rack[1-2]-n[01-02]``, which both read the same."""
    out = slurm.run(["scontrol", "show", "hostnames", "n[1-2]-ib"], timeout=30)
    assert out.stdout == "" and "Invalid hostlist: n[1-2]-ib" in out.stderr  # (scontrol still exits 0)
    assert expand_nodelist("n[1-2]-ib") == ["n1-ib", "n2-ib"]


def test_scontrol_compresses_what_tfaccel_expands_back(slurm) -> None:
    """SLURM's own compressed form (``scontrol show hostlist``) of host names in rank order reads back the same."""
    names = ["node9", "node10", "node11", "gpu001", "gpu002", "gpu010"]
    out = slurm.run(["scontrol", "show", "hostlist", ",".join(names)], timeout=30)
    assert out.returncode == 0, out.stderr
    assert expand_nodelist(out.stdout.strip()) == names, out.stdout


# Each task: SLURM's facts, and the address tfaccel gives its rank (no TensorFlow imported).
_PROBE = ("import json, os; from tfaccel.cluster import slurm_task; t = slurm_task(port=23456); "
          "print(json.dumps({k: os.environ.get(k) for k in ('SLURM_PROCID', 'SLURMD_NODENAME', 'SLURM_STEP_NODELIST', "
          "'SLURM_STEP_TASKS_PER_NODE', 'SLURM_DISTRIBUTION', 'SLURM_LOCALID')} | {'address': t.address, "
          "'workers': list(t.spec.roles['worker'])}))")


@pytest.mark.parametrize("args,tasks_per_node,expected", [
    (["-N", "2", "-n", "3"], "2,1", ["node9:23456", "node9:23457", "node10:23456"]),
    (["-N", "2", "-n", "4", "-m", "cyclic"], "2(x2)", ["node9:23456", "node10:23456", "node9:23457", "node10:23457"]),
    (["-N", "2", "-n", "4", "-m", "block"], "2(x2)", ["node9:23456", "node9:23457", "node10:23456", "node10:23457"]),
])
def test_ranks_land_where_srun_put_them(slurm, args, tasks_per_node, expected) -> None:
    out = slurm.run(["srun", "-p", "multi", *args, "python", "-c", _PROBE], timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    tasks = sorted((json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")),
                   key=lambda t: int(t["SLURM_PROCID"]))
    assert len(tasks) == len(expected), out.stdout
    for rank, task in enumerate(tasks):
        assert task["SLURM_STEP_NODELIST"] == "node[9-10]"  # node9 before node10: rank order, not text order
        assert task["SLURM_STEP_TASKS_PER_NODE"] == tasks_per_node
        assert task["workers"] == expected
        assert task["address"] == expected[rank]
        assert task["address"].split(":")[0] == task["SLURMD_NODENAME"]  # the node SLURM really ran it on
        assert int(task["address"].split(":")[1]) - 23456 == int(task["SLURM_LOCALID"])


def test_the_cluster_script_is_idempotent_and_says_what_is_wrong(slurm) -> None:
    """`up` on a running cluster only prints the environment (same daemons); bad usage and `status` of a directory
    without a cluster are one clear line each."""
    pids = {p.name: p.read_text() for p in (slurm.dir / "run").glob("*.pid")}
    again = slurm.run(["bash", str(SCRIPT), "up", str(slurm.dir)], timeout=60)
    assert again.returncode == 0 and f"export SLURM_CONF={slurm.dir}/slurm.conf" in again.stdout, again.stderr
    assert {p.name: p.read_text() for p in (slurm.dir / "run").glob("*.pid")} == pids
    status = slurm.run(["bash", str(SCRIPT), "status", str(slurm.dir)], timeout=60)
    assert status.returncode == 0 and "node10" in status.stdout and "idle" in status.stdout
    empty = slurm.run(["bash", str(SCRIPT), "status", str(slurm.dir / "none")], timeout=60,
                      env={"SLURM_CONF": str(slurm.dir / "none" / "slurm.conf")})
    assert empty.returncode == 1 and "no running cluster in" in empty.stderr
    bad = slurm.run(["bash", str(SCRIPT), "start"], timeout=30)
    assert bad.returncode == 2 and "unknown command 'start'; valid: up, down, status" in bad.stderr
