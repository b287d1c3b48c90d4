"""The SLURM reader, with injected environments (no SLURM needed)."""

import json

import pytest

from tfaccel.cluster import ClusterConfigError, ClusterSpec, expand_nodelist, parse_tasks_per_node, slurm_task, \
    task_from_env
from tfaccel.cluster.slurm import in_job_step


@pytest.mark.parametrize("nodelist, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a[1],b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("cn-[5]-x", ["cn-5-x"]),
])
def test_expand_nodelist(nodelist: str, hosts: list) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, expected", [
    ("", "is empty; run inside an allocation"),
    ("node[01-03", "'[' without a matching ']'"),
    ("node01]", "']' without a matching '['"),
    ("n[[1]]", "nested brackets"),
    ("n[3-1]", "range '3-1' runs backwards"),
    ("n[a-b]", "bad range 'a-b' in [a-b]"),
    ("n[1-]", "bad range '1-'"),
    ("a,,b", "empty host name"),
    ("a b", "contains whitespace"),
    ("n[1-2],n2", "names host(s) n2 twice"),
    ("n[1-999999]", "implausibly large"),
])
def test_expand_nodelist_errors(nodelist: str, expected: str) -> None:
    with pytest.raises(ClusterConfigError) as info:
        expand_nodelist(nodelist, var="SLURM_STEP_NODELIST")
    assert str(info.value).startswith(f'SLURM: SLURM_STEP_NODELIST "{nodelist}": ')
    assert expected in str(info.value)


@pytest.mark.parametrize("value, nodes, counts", [
    ("2(x3),1", 4, [2, 2, 2, 1]),
    ("2", 3, [2, 2, 2]),
    ("1,3", 2, [1, 3]),
    ("4(x1)", 1, [4]),
])
def test_parse_tasks_per_node(value: str, nodes: int, counts: list) -> None:
    assert parse_tasks_per_node(value, nodes) == counts


@pytest.mark.parametrize("value, nodes, expected", [
    ("2(x3)", 2, "gives 3 node count(s) but the node list has 2 node(s)"),
    ("2(3)", 3, "bad item '2(3)'"),
    ("x", 1, "bad item 'x'"),
    ("0", 1, "every node needs at least 1 task"),
])
def test_parse_tasks_per_node_errors(value: str, nodes: int, expected: str) -> None:
    with pytest.raises(ClusterConfigError, match=r"^SLURM: SLURM_TASKS_PER_NODE ") as info:
        parse_tasks_per_node(value, nodes)
    assert expected in str(info.value)


def _env(**kw: object) -> dict:
    """A task's environment inside srun (srun sets SLURM_STEP_ID; the batch script does not)."""
    return dict({"SLURM_STEP_ID": "0"}, **{k: str(v) for k, v in kw.items()})


def test_not_under_srun_is_none() -> None:
    assert slurm_task({}) is None
    assert slurm_task(_env(SLURM_JOB_NODELIST="n[1-2]")) is None       # no SLURM_PROCID
    assert slurm_task(_env(SLURM_PROCID="0")) is None                   # no node list
    assert task_from_env(_env(SLURM_PROCID="0")) is None


def test_batch_script_is_not_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's script has SLURM_PROCID=0 and the job's node list but is not a task of a step."""
    import logging

    import tfaccel
    from tfaccel.cluster import slurm

    monkeypatch.setattr(slurm, "_warned_not_in_step", False)
    seen = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = _Catch()
    logger = tfaccel.get_logger()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)  # another test may have quietened it
    try:
        batch = {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "gnode[10,20,25,37]", "SLURM_TASKS_PER_NODE": "1(x4)",
                 "SLURM_NTASKS": "4"}
        assert task_from_env(batch) is None
        assert task_from_env(batch) is None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert len(seen) == 1, seen  # warned once
    assert seen[0].startswith("SLURM: SLURM_PROCID is set but SLURM_STEP_NODELIST / SLURM_STEP_ID are not")
    assert "start one task per worker with srun to use the 4 node(s)" in seen[0]
    assert task_from_env(dict(batch, SLURM_STEP_ID="0")) is not None  # the same variables inside srun


def test_one_task_per_node_default_port() -> None:
    env = _env(SLURM_PROCID=2, SLURM_JOB_NODELIST="node[01-03,07]", SLURM_NTASKS=4)
    info = slurm_task(env)
    assert info is not None
    assert info.spec.roles == {"worker": ("node01:8888", "node02:8888", "node03:8888", "node07:8888")}
    assert (info.task_type, info.task_index, info.source, info.is_chief) == ("worker", 2, "SLURM", False)
    assert info.spec.strategy_hint == "multi_worker"
    # through the public entry points too
    assert task_from_env(env) == info
    assert ClusterSpec.from_env(env) == info.spec


def test_several_tasks_per_node_get_consecutive_ports() -> None:
    env = _env(SLURM_PROCID=3, SLURM_STEP_NODELIST="gpu[1-2]", SLURM_STEP_TASKS_PER_NODE="2(x2)",
               SLURM_JOB_NODELIST="gpu[1-4]", SLURM_TASKS_PER_NODE="2(x4)")
    info = slurm_task(env, port=2222)
    assert info is not None
    assert info.spec.roles == {"worker": ("gpu1:2222", "gpu1:2223", "gpu2:2222", "gpu2:2223")}  # step wins
    assert info.name == "worker:3" and info.address == "gpu2:2223"


def test_ntasks_per_node_and_multiple_groups() -> None:
    env = _env(SLURM_PROCID=0, SLURM_JOB_NODELIST="a[1-2],b3", SLURM_NTASKS_PER_NODE=2)
    info = slurm_task(env, port=5000)
    assert info is not None and info.is_chief
    assert info.spec.roles["worker"] == ("a1:5000", "a1:5001", "a2:5000", "a2:5001", "b3:5000", "b3:5001")


def test_tasks_per_node_uneven_form() -> None:
    env = _env(SLURM_PROCID=6, SLURM_JOB_NODELIST="n[1-4]", SLURM_TASKS_PER_NODE="2(x3),1")
    info = slurm_task(env, port=7000)
    assert info is not None
    assert info.spec.roles["worker"][-1] == "n4:7000" and info.task_index == 6


def test_port_from_environment_variable_and_argument_precedence() -> None:
    env = _env(SLURM_PROCID=0, SLURM_JOB_NODELIST="n1", TFACCEL_SLURM_PORT=3000)
    assert slurm_task(env).spec.roles["worker"] == ("n1:3000",)  # type: ignore[union-attr]
    assert slurm_task(env, port=4000).spec.roles["worker"] == ("n1:4000",)  # type: ignore[union-attr]
    assert ClusterSpec.from_env(env, port=4001).roles["worker"] == ("n1:4001",)  # type: ignore[union-attr]


def test_parameter_servers() -> None:
    base = dict(SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="2(x3)")
    roles = {"chief": ("n1:9000",), "worker": ("n2:9001", "n3:9000", "n3:9001"), "ps": ("n1:9001", "n2:9000")}
    expected = ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    for rank, name in enumerate(expected):
        info = slurm_task(_env(SLURM_PROCID=rank, **base), port=9000, ps=2)
        assert info is not None and info.name == name
        assert info.spec.roles == roles and info.spec.strategy_hint == "parameter_server"
    env_ps = slurm_task(_env(SLURM_PROCID=1, TFACCEL_SLURM_PS=1, **base), port=9000)
    assert env_ps is not None and env_ps.name == "ps:0"


def test_ntasks_smaller_than_slots_trims() -> None:
    env = _env(SLURM_PROCID=2, SLURM_JOB_NODELIST="n[1-2]", SLURM_NTASKS_PER_NODE=2, SLURM_NTASKS=3)
    info = slurm_task(env, port=100)
    assert info is not None and info.spec.roles["worker"] == ("n1:100", "n1:101", "n2:100")


def test_matching_node_name_is_accepted() -> None:
    env = _env(SLURM_PROCID=1, SLURM_JOB_NODELIST="n[1-2]", SLURMD_NODENAME="n2")
    assert slurm_task(env) is not None


@pytest.mark.parametrize("env, kwargs, expected", [
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="x", SLURM_JOB_NODELIST="n1"), {}, 'SLURM: SLURM_PROCID "x": must be an integer >= 0'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="2", SLURM_JOB_NODELIST="n[1-2]"), {},
     'SLURM: SLURM_PROCID "2": task rank out of range: the step has 2 task(s), 0-1'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n[1-2]", SLURM_NTASKS="5"), {},
     'SLURM: SLURM_NTASKS "5": is more than the 2 task slot(s)'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1", SLURM_NTASKS_PER_NODE="0"), {},
     'SLURM_NTASKS_PER_NODE "0": must be an integer >= 1'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1", TFACCEL_SLURM_PORT="http"), {},
     'SLURM: TFACCEL_SLURM_PORT "http": must be an integer >= 1'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1"), {"port": 70000}, "SLURM: port 70000: port must be 1-65535"),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1", TFACCEL_SLURM_PORT="70000"), {},
     "SLURM: TFACCEL_SLURM_PORT 70000: port must be 1-65535"),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1", SLURM_NTASKS_PER_NODE="4"), {"port": 65534},
     "port + tasks per node - 1 = 65537 is above 65535"),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n[1-2]"), {"ps": 1},
     "SLURM: ps 1: parameter-server training needs a chief, 1 ps and at least one worker, i.e. 3 task(s), "
     "but the step has 2"),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1"), {"ps": -1}, "SLURM: ps -1: must be an integer >= 0"),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n1", TFACCEL_SLURM_PS="many"), {},
     'SLURM: TFACCEL_SLURM_PS "many": must be an integer >= 0'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n[1-2]", SLURMD_NODENAME="n2"), {},
     'SLURM: SLURMD_NODENAME "n2": rank 0 should run on n1 under the block distribution'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="1", SLURM_JOB_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE="2(x2)",
          SLURM_DISTRIBUTION="cyclic", SLURMD_NODENAME="n1"), {},
     'SLURM: SLURMD_NODENAME "n1": rank 1 should run on n2 under the cyclic distribution (SLURM_DISTRIBUTION '
     '"cyclic") that tfaccel read; run srun with --distribution=block or cyclic'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n[1-2]", SLURM_DISTRIBUTION="plane=2"), {},
     'SLURM: SLURM_DISTRIBUTION "plane=2": tfaccel can place ranks under the block (srun\'s default) and cyclic '
     'distributions only; run srun with --distribution=block or --distribution=cyclic'),
    (dict(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_JOB_NODELIST="n[1-"), {}, "'[' without a matching ']'"),
])
def test_slurm_errors(env: dict, kwargs: dict, expected: str) -> None:
    before = dict(env)
    with pytest.raises(ClusterConfigError) as info:
        task_from_env(env, **kwargs)
    assert expected in str(info.value)
    assert env == before


def test_slurm_task_exports_a_tf_config_tf_reads() -> None:
    info = slurm_task(_env(SLURM_PROCID=1, SLURM_JOB_NODELIST="n[1-2]"), port=2222)
    assert info is not None
    env: dict = {}
    info.spec.export(info.name, env)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": ["n1:2222", "n2:2222"]},
                                            "task": {"type": "worker", "index": 1}}
    again = task_from_env(env)  # now TF_CONFIG is set: it is what the process reads next
    assert again is not None and again.source == "TF_CONFIG" and again.spec == info.spec


@pytest.mark.parametrize("distribution,expected", [
    (None, ["n1:2222", "n1:2223", "n2:2222", "n2:2223", "n3:2222"]),
    ("block", ["n1:2222", "n1:2223", "n2:2222", "n2:2223", "n3:2222"]),
    ("cyclic", ["n1:2222", "n2:2222", "n3:2222", "n1:2223", "n2:2223"]),
    ("cyclic:block", ["n1:2222", "n2:2222", "n3:2222", "n1:2223", "n2:2223"]),
    ("block:cyclic", ["n1:2222", "n1:2223", "n2:2222", "n2:2223", "n3:2222"]),
])
def test_ranks_follow_the_node_level_distribution(distribution, expected) -> None:
    """srun's -m block (default) fills node after node; -m cyclic deals ranks round-robin over the nodes with room
    (checked against real srun placements in tests/slurm/test_slurm_hostlists.py)."""
    env = _env(SLURM_PROCID=0, SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="2(x2),1")
    if distribution is not None:
        env["SLURM_DISTRIBUTION"] = distribution
    info = slurm_task(env, port=2222)
    assert info is not None and list(info.spec.roles["worker"]) == expected


def test_in_job_step_tells_a_task_from_the_batch_script() -> None:
    assert in_job_step({"SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "n1"})
    assert not in_job_step({"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n1"})  # sbatch's own shell
    assert not in_job_step({"SLURM_STEP_ID": "0"})
