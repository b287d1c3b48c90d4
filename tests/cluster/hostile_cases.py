"""The hostile-input corpus of issue 24: cluster files, TF_CONFIG, SLURM variables and CLI arguments that must each
end in one line ``tfaccel VERB: error: ...`` and exit code 2 -- never a traceback, within 2 s and 200 MB.

Each case is ``Case(name, argv, env, file)``: ``file`` (text, bytes or an existing path such as ``/dev/zero``) is
written to a temporary file whose path replaces ``{file}`` in ``argv``. :func:`run_case` runs one in this process
(``tfaccel.cli.main.main``), timing it and measuring its Python allocations with ``tracemalloc``.
``python tests/cluster/hostile_cases.py`` prints the tally.
"""

import contextlib
import dataclasses
import io
import json
import os
import re
import sys
import time
import traceback
import tracemalloc
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

CLUSTER_ENV_PREFIXES = ("SLURM_", "TF_CONFIG", "TFACCEL_SLURM_", "HOROVOD_", "OMPI_COMM_WORLD", "PMI_")
MAX_SECONDS = 2.0
MAX_MB = 200.0


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    argv: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...] = ()
    file: Union[None, str, bytes] = None
    suffix: str = ".yaml"


def _c(name: str, argv: Sequence[str], env: Optional[Dict[str, str]] = None, file: Union[None, str, bytes] = None,
       suffix: str = ".yaml") -> Case:
    return Case(name, tuple(argv), tuple(sorted((env or {}).items())), file, suffix)


# ------------------------------------------------------------------------------------------------- documents
def _bomb(levels: int, width: int, leaf: str = '"h:1"', key: str = "worker") -> str:
    lines = [f"a0: &a0 [{', '.join([leaf] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    lines.append(f"{key}: [{', '.join([f'*a{levels - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _map_bomb(levels: int, width: int) -> str:
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: x" for j in range(width)) + "}"]
    for i in range(1, levels):
        lines.append(f"m{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(width)) + "}")
    lines.append(f"worker: *m{levels - 1}")
    return "\n".join(lines) + "\n"


YAML_ONLY: Dict[str, Union[str, bytes]] = {
    "alias bomb 9 levels x 9 (558 bytes, 10 ** 9 values)": _bomb(9, 9),
    "alias bomb 6x12": _bomb(6, 12),
    "alias bomb of mappings": _map_bomb(8, 8),
    "alias bomb as a role value": ("a: &a ['h:1','h:2','h:3','h:4','h:5']\nb: &b [*a,*a,*a,*a,*a]\n"
                                   "c: &c [*b,*b,*b,*b,*b]\nworker: *c\n"),
    "alias bomb in the task": _bomb(7, 8, key="task"),
    "alias bomb with a bad leaf": _bomb(8, 8, leaf="[1]"),
    "self-referencing mapping": "worker: &w {a: *w}\n",
    "self-referencing list": "worker: &w [*w]\n",
    "yaml block nesting 100000": "- " * 100000 + "x\n",
    "yaml block nesting 40": "".join("  " * i + "- \n" for i in range(40)) + "  " * 40 + "x\n",
    "yaml mapping nesting 5000": "".join("  " * i + f"k{i}:\n" for i in range(5000)),
    "yaml duplicate role": "worker: ['a:1']\nworker: ['b:1']\n",
    "yaml duplicate nested key": "cluster: {worker: ['a:1']}\ntask: {type: worker, index: 0, index: 1}\n",
    "yaml duplicate long key": ("k" * 5000 + ": 1\n") * 2,
    "yaml python tag": "worker: !!python/object/apply:os.system ['true']\n",
    "yaml unknown tag": "worker: !custom ['a:1']\n",
    "yaml merge key bomb": "a: &a {x: 1}\n" + "worker: {<<: [" + ", ".join(["*a"] * 5000) + "]}\n",
    "yaml list as key": "? [a, b]\n: ['h:1']\n",
    "yaml bare port numbers": "worker: [2222, 2223]\n",
    "yaml booleans": "worker: [yes, no]\n",
    "yaml tabs": "worker:\n\t- a:1\n",
    "yaml binary tag": "worker: !!binary aGVsbG8=\n",
    "yaml anchors 10000": "".join(f"a{i}: &a{i} 'h:{i % 65535 + 1}'\n" for i in range(10000)) + "worker: [*a1]\n",
    "yaml multi document": "worker: ['a:1']\n---\nworker: ['b:1']\n",
    "yaml null": "~\n",
    "yaml scalar": "just text\n",
    "yaml unclosed flow": "worker: [a:1\n",
    "yaml nul bytes": "worker: ['a:1']\x00\x00\n",
}

_WORKER = {"type": "worker", "index": 0}


def _doc(cluster: object, task: object = None, **extra: object) -> str:
    body: Dict[str, object] = {"cluster": cluster}
    if task is not None:
        body["task"] = task
    body.update(extra)
    return json.dumps(body)


EQUIVALENT = [("localhost:2222", "127.0.0.1:2222"), ("LOCALHOST:2222", "localhost:2222"),
              ("Node1:2222", "node1:2222"), ("NODE1.EXAMPLE.COM:1", "node1.example.com:1"),
              ("[::1]:2222", "[0:0::1]:2222"), ("[::1]:2222", "[0000:0000:0000:0000:0000:0000:0000:0001]:2222"),
              ("[::ffff:127.0.0.1]:2222", "127.0.0.1:2222"), ("[::ffff:7f00:1]:2222", "localhost:2222"),
              ("[FE80::1]:2222", "[fe80::1]:2222"), ("[2001:db8::1]:1", "[2001:DB8:0:0:0:0:0:1]:1")]

JSON_DOCS: Dict[str, str] = {
    "deep list 100000": "[" * 100000,
    "deep list 1000 closed": "[" * 1000 + "]" * 1000,
    "deep list 40 closed": "[" * 40 + "]" * 40,
    "deep object 100000": '{"a":' * 100000,
    "deep object 900 closed": '{"a":' * 900 + "1" + "}" * 900,
    "deep in cluster": _doc({"worker": json.loads("[" * 60 + "]" * 60)}, _WORKER),
    "deep in task": _doc({"worker": ["a:1"]}, json.loads('{"a":' * 50 + "1" + "}" * 50)),
    "duplicate task key": '{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0},"task":{"type":"worker",'
                          '"index":0}}',
    "duplicate role key": '{"cluster":{"worker":["a:1"],"worker":["b:1"]},"task":{"type":"worker","index":0}}',
    "duplicate index key": '{"cluster":{"worker":["a:1","b:1"]},"task":{"type":"worker","index":0,"index":1}}',
    "duplicate cluster key": '{"cluster":{"worker":["a:1"]},"cluster":{"worker":["b:1"]},"task":{"type":"worker",'
                             '"index":0}}',
    "many keys": json.dumps({f"k{i}": i for i in range(30000)}),
    "huge list of numbers": _doc({"worker": list(range(60000))}, _WORKER),
    "wide valid-looking list with one bad": _doc({"worker": [f"h{i}:1" for i in range(20000)] + ["bad"]}, _WORKER),
    "20000 hosts one duplicate at the end": _doc({"worker": [f"h{i}:1" for i in range(20000)] + ["H0:1"]}, _WORKER),
    "oversize whitespace": " " * (1024 * 1024 + 1),
    "oversize string": json.dumps({"cluster": {"worker": ["a:1"]}, "x": "y" * (1024 * 1024)}),
    "port with 5000 digits": _doc({"worker": ["a:" + "9" * 5000]}, _WORKER),
    "port with unicode digits": _doc({"worker": ["a:\u0662\u0662"]}, _WORKER),
    "port fullwidth digits": _doc({"worker": ["a:\uff12\uff12"]}, _WORKER),
    "port 0": _doc({"worker": ["a:0"]}, _WORKER),
    "port 65536": _doc({"worker": ["a:65536"]}, _WORKER),
    "port negative": _doc({"worker": ["a:-1"]}, _WORKER),
    "port leading zeros": _doc({"worker": ["a:02222"]}, _WORKER),
    "port missing": _doc({"worker": ["a:"]}, _WORKER),
    "no port": _doc({"worker": ["a"]}, _WORKER),
    "host 300 characters": _doc({"worker": ["h" * 300 + ":1"]}, _WORKER),
    "host 100000 characters": _doc({"worker": ["h" * 100000 + ":1"]}, _WORKER),
    "host with newline": _doc({"worker": ["a\nb:1"]}, _WORKER),
    "host with NUL": _doc({"worker": ["a\u0000b:1"]}, _WORKER),
    "host with escape sequence": _doc({"worker": ["\u001b[31mred:1"]}, _WORKER),
    "host with shell": _doc({"worker": ["$(reboot):1"]}, _WORKER),
    "host with protocol": _doc({"worker": ["grpc://a:1"]}, _WORKER),
    "host with spaces": _doc({"worker": [" a:1"]}, _WORKER),
    "host empty": _doc({"worker": [":1"]}, _WORKER),
    "host double dot": _doc({"worker": ["a..b:1"]}, _WORKER),
    "ipv6 unbracketed": _doc({"worker": ["::1:2222"]}, _WORKER),
    "ipv6 bad in brackets": _doc({"worker": ["[zz::1]:1"]}, _WORKER),
    "address as number": _doc({"worker": [2222]}, _WORKER),
    "address as bool": _doc({"worker": [True]}, _WORKER),
    "address as null": _doc({"worker": [None]}, _WORKER),
    "address as list": _doc({"worker": [["a:1"]]}, _WORKER),
    "address as object": _doc({"worker": [{"host": "a", "port": 1}]}, _WORKER),
    "address as float": _doc({"worker": [1e400]}, _WORKER).replace("Infinity", "1e400"),
    "role as string": _doc({"worker": "a:1"}, _WORKER),
    "role empty list": _doc({"worker": []}, _WORKER),
    "role null": _doc({"worker": None}, _WORKER),
    "unknown role": _doc({"workers": ["a:1"]}, _WORKER),
    "unknown role 10000 characters": _doc({"r" * 10000: ["a:1"]}, _WORKER),
    "role uppercase": _doc({"Worker": ["a:1"]}, _WORKER),
    "two chiefs": _doc({"chief": ["a:1", "b:1"], "worker": ["c:1"]}, {"type": "chief", "index": 0}),
    "two evaluators": _doc({"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}, _WORKER),
    "ps without worker": _doc({"ps": ["a:1"], "chief": ["b:1"]}, {"type": "chief", "index": 0}),
    "only evaluator": _doc({"evaluator": ["a:1"]}, {"type": "evaluator", "index": 0}),
    "master and chief": _doc({"master": ["a:1"], "chief": ["b:1"]}, {"type": "chief", "index": 0}),
    "cluster empty": _doc({}, _WORKER),
    "cluster list": _doc(["a:1"], _WORKER),
    "cluster string": _doc("a:1", _WORKER),
    "cluster null": _doc(None, _WORKER),
    "task index 5000 digits": _doc({"worker": ["a:1"]}, {"type": "worker", "index": int("9" * 4000)}),
    "task index huge float": _doc({"worker": ["a:1"]}, {"type": "worker", "index": 0}).replace('"index": 0',
                                                                                              '"index": 1e999'),
    "task index negative": _doc({"worker": ["a:1"]}, {"type": "worker", "index": -1}),
    "task index out of range": _doc({"worker": ["a:1"]}, {"type": "worker", "index": 7}),
    "task index string": _doc({"worker": ["a:1"]}, {"type": "worker", "index": "0"}),
    "task index bool": _doc({"worker": ["a:1"]}, {"type": "worker", "index": True}),
    "task index float": _doc({"worker": ["a:1"]}, {"type": "worker", "index": 0.5}),
    "task type long": _doc({"worker": ["a:1"]}, {"type": "w" * 100000, "index": 0}),
    "task type not in cluster": _doc({"worker": ["a:1"]}, {"type": "ps", "index": 0}),
    "task type number": _doc({"worker": ["a:1"]}, {"type": 1, "index": 0}),
    "task unknown key": _doc({"worker": ["a:1"]}, {"type": "worker", "index": 0, "x" * 5000: 1}),
    "task list": _doc({"worker": ["a:1"]}, ["worker", 0]),
    "task missing index": _doc({"worker": ["a:1"]}, {"type": "worker"}),
    "unknown top key": _doc({"worker": ["a:1"]}, _WORKER, **{"k" * 3000: 1}),
    "environment not a string": _doc({"worker": ["a:1"]}, _WORKER, environment=["cloud"] * 1000),
    "environment empty": _doc({"worker": ["a:1"]}, _WORKER, environment=""),
    "rpc_layer number": _doc({"worker": ["a:1"]}, _WORKER, rpc_layer=7),
    "kubeflow cloud bad evaluator": _doc({"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1", "f:1"]},
                                         {"type": "evaluator", "index": 0}, environment="cloud"),
    "kubeflow cloud task missing": _doc({"chief": ["c:1"], "worker": ["w:1"]}, {"type": "worker", "index": 3},
                                        environment="cloud"),
    "kubeflow cloud duplicate pods": _doc({"chief": ["tfjob-chief-0:2222"], "worker": ["TFJOB-CHIEF-0:2222"]},
                                          {"type": "chief", "index": 0}, environment="cloud"),
    "not an object": '"just a string"',
    "a number": "42",
    "true": "true",
    "json garbage": "{cluster: worker}",
    "truncated json": '{"cluster": {"worker": ["a:1"',
    "json nan": '{"cluster": {"worker": [NaN]}, "task": {"type": "worker", "index": 0}}',
    "json 5000-digit integer": '{"cluster": {"worker": [' + "9" * 5000 + ']}}',
    "lone surrogate": '{"cluster": {"worker": ["\\ud800:1"]}, "task": {"type": "worker", "index": 0}}',
}
for _i, (_a, _b) in enumerate(EQUIVALENT):
    JSON_DOCS[f"equivalent addresses {_a} = {_b}"] = _doc({"worker": [_a, _b]}, _WORKER)
    JSON_DOCS[f"equivalent across roles {_a} = {_b}"] = _doc({"chief": [_a], "worker": [_b]},
                                                             {"type": "chief", "index": 0})
    JSON_DOCS[f"equivalent ps/worker {_a} = {_b}"] = _doc({"chief": ["c:9"], "worker": [_a], "ps": [_b]},
                                                          {"type": "chief", "index": 0})

FILE_ONLY: Dict[str, Union[str, bytes]] = {
    "empty file": "",
    "not utf-8": b"worker: ['\xff\xfe:1']\n",
    "binary": bytes(range(256)) * 10,
    "utf-16": "worker: ['a:1']\n".encode("utf-16"),
    "oversize file 1 MiB + 1": b"#" * (1024 * 1024 + 1),
    "oversize valid list": ("worker:\n" + "".join(f"  - 'host{i}.example.com:2222'\n" for i in range(40000))),
}
SPECIAL_PATHS = {"endless /dev/zero": "/dev/zero", "endless /dev/urandom": "/dev/urandom",
                 "a directory": "/", "no such file": "/nonexistent/tfaccel/cluster.yaml",
                 "/dev/null": "/dev/null", "path of 5000 characters": "/" + "x" * 5000 + ".yaml",
                 "/proc/self/environ": "/proc/self/environ"}


def _reader_cases() -> List[Case]:
    """Every document through every reader that can be given it."""
    out: List[Case] = []
    file_readers = {
        "tf-config FILE": ("tf-config", "{file}"),
        "tf-config FILE --all": ("tf-config", "{file}", "--all", "--format", "env"),
        "tf-config FILE --tfjob": ("tf-config", "{file}", "--tfjob", "job", "--image", "img"),
        "launch --cluster --dry-run": ("launch", "--cluster", "{file}", "--dry-run", "--", sys.executable, "-c", "1"),
    }
    for doc_name, text in JSON_DOCS.items():
        out.append(_c(f"TF_CONFIG: {doc_name}", ["tf-config"], {"TF_CONFIG": text}))
        out.append(_c(f"json file: {doc_name}", file_readers["tf-config FILE"], file=text, suffix=".json"))
        out.append(_c(f"yaml file: {doc_name}", file_readers["tf-config FILE"], file=text))
    for doc_name in list(JSON_DOCS)[:40]:
        out.append(_c(f"TF_CONFIG via tf-config --format env: {doc_name}", ["tf-config", "--format", "env"],
                      {"TF_CONFIG": JSON_DOCS[doc_name]}))
    for doc_name, text in YAML_ONLY.items():
        for reader, argv in file_readers.items():
            out.append(_c(f"{reader}: {doc_name}", argv, file=text))
    for doc_name, text in FILE_ONLY.items():
        for reader, argv in file_readers.items():
            out.append(_c(f"{reader}: {doc_name}", argv, file=text))
    for path_name, path in SPECIAL_PATHS.items():
        out.append(_c(f"tf-config: {path_name}", ["tf-config", path]))
        out.append(_c(f"launch --cluster: {path_name}", ["launch", "--cluster", path, "--dry-run", "--", "x"]))
    return out


# ------------------------------------------------------------------------------------------------- SLURM
def _slurm(nodelist: str, **extra: str) -> Dict[str, str]:
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_ID": "0"}
    env.update(extra)
    return env


SLURM: Dict[str, Dict[str, str]] = {
    "product a[0-99999]b[0-99999]": _slurm("a[0-99999]b[0-99999]"),
    "product of six groups": _slurm("n" + "[0-9]" * 6),
    "product of 5000 one-value groups": _slurm("x" + "[1]" * 5000),
    "5000 groups of two": _slurm("x" + "[1-2]" * 5000),
    "range of 5000 digits": _slurm("a[" + "9" * 5000 + "]"),
    "range to 5000 digits": _slurm("a[1-" + "9" * 5000 + "]"),
    "range 1-999999": _slurm("n[1-999999]"),
    "ranges summing past the cap": _slurm("n[0-60000,60001-120000]"),
    "backwards range": _slurm("n[3-1]"),
    "unicode digits in range": _slurm("n[\u0661-\u0662]"),
    "letters in range": _slurm("n[a-b]"),
    "unclosed bracket": _slurm("n[1-2"),
    "stray closing bracket": _slurm("n]1"),
    "nested brackets": _slurm("n[[1]]"),
    "empty brackets": _slurm("n[]"),
    "empty host": _slurm("a,,b"),
    "whitespace": _slurm("a b"),
    "newline": _slurm("a\nb"),
    "duplicate host": _slurm("n[1-2],n2"),
    "duplicate host other case": _slurm("n1,N1"),
    "20001 hosts one duplicate": _slurm(",".join(f"h{i}" for i in range(20000)) + ",h7"),
    "100001 single hosts": _slurm(",".join(f"h{i}" for i in range(100001))),
    "1 MiB node list": _slurm("n" * (1024 * 1024 + 1)),
    "host too long": _slurm("h" * 300),
    "host with shell": _slurm("$(reboot)"),
    "only comma": _slurm(","),
    "tasks per node repeat 999999999999": _slurm("a", SLURM_STEP_TASKS_PER_NODE="1(x999999999999)"),
    "tasks per node repeat 999999999": _slurm("a", SLURM_STEP_TASKS_PER_NODE="1(x999999999)"),
    "tasks per node 5000 digits": _slurm("a", SLURM_STEP_TASKS_PER_NODE="9" * 5000),
    "tasks per node 999999999": _slurm("a", SLURM_STEP_TASKS_PER_NODE="999999999"),
    "tasks per node 70000": _slurm("a", SLURM_STEP_TASKS_PER_NODE="70000"),
    "tasks per node x 100000 nodes": _slurm("n[0-99999]", SLURM_STEP_TASKS_PER_NODE="60000(x100000)"),
    "tasks per node zero": _slurm("a", SLURM_STEP_TASKS_PER_NODE="0"),
    "tasks per node garbage": _slurm("a", SLURM_STEP_TASKS_PER_NODE="x"),
    "tasks per node mismatch": _slurm("a[1-2]", SLURM_STEP_TASKS_PER_NODE="2(x3)"),
    "tasks per node unclosed": _slurm("a", SLURM_STEP_TASKS_PER_NODE="1(x"),
    "tasks per node 1 MiB": _slurm("a", SLURM_STEP_TASKS_PER_NODE="1," * (600 * 1024)),
    "ntasks per node 5000 digits": _slurm("a", SLURM_NTASKS_PER_NODE="9" * 5000),
    "ntasks per node zero": _slurm("a", SLURM_NTASKS_PER_NODE="0"),
    "procid 5000 digits": _slurm("a", SLURM_PROCID="9" * 5000),
    "procid negative": _slurm("a", SLURM_PROCID="-1"),
    "procid unicode digit": _slurm("a", SLURM_PROCID="\u0663"),
    "procid superscript": _slurm("a", SLURM_PROCID="\u00b2"),
    "procid out of range": _slurm("a[1-2]", SLURM_PROCID="2"),
    "procid text": _slurm("a", SLURM_PROCID="zero"),
    "ntasks too many": _slurm("a", SLURM_NTASKS="5"),
    "ntasks 5000 digits": _slurm("a", SLURM_NTASKS="9" * 5000),
    "ntasks zero": _slurm("a", SLURM_NTASKS="0"),
    "step num tasks text": _slurm("a", SLURM_STEP_NUM_TASKS="many"),
    "port 0": _slurm("a", TFACCEL_SLURM_PORT="0"),
    "port 70000": _slurm("a", TFACCEL_SLURM_PORT="70000"),
    "port 5000 digits": _slurm("a", TFACCEL_SLURM_PORT="9" * 5000),
    "port plus tasks past 65535": _slurm("a", TFACCEL_SLURM_PORT="65535", SLURM_STEP_TASKS_PER_NODE="2"),
    "ps too many": _slurm("a[1-2]", TFACCEL_SLURM_PS="5"),
    "ps 5000 digits": _slurm("a", TFACCEL_SLURM_PS="9" * 5000),
    "ps negative": _slurm("a", TFACCEL_SLURM_PS="-1"),
    "node name mismatch": _slurm("a[1-2]", SLURMD_NODENAME="b" * 5000),
    "job nodelist only product": {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "a[0-99999]b[0-9]",
                                  "SLURM_STEP_ID": "0"},
}


def _slurm_cases() -> List[Case]:
    out = [_c(f"SLURM: {name}", ["tf-config"], env) for name, env in SLURM.items()]
    out += [_c(f"SLURM --format env: {name}", ["tf-config", "--format", "env"], env)
            for name, env in list(SLURM.items())[:20]]
    out += [_c("SLURM --slurm-port 0", ["tf-config", "--slurm-port", "0"], _slurm("a")),
            _c("SLURM --slurm-port 99999999999", ["tf-config", "--slurm-port", "99999999999"], _slurm("a")),
            _c("SLURM --slurm-ps -1", ["tf-config", "--slurm-ps", "-1"], _slurm("a")),
            _c("SLURM --slurm-ps too many", ["tf-config", "--slurm-ps", "3"], _slurm("a[1-2]"))]
    return out


# ------------------------------------------------------------------------------------------------- CLI arguments
VALID = "worker: ['127.0.0.1:2222', '127.0.0.1:2223']\n"
BIG = "9" * 5000


def _cli_cases() -> List[Case]:
    x = sys.executable
    launch = [
        ("--workers x", ["--workers", "x"]), ("--workers -1", ["--workers", "-1", "--", x]),
        ("--workers huge", ["--workers", BIG, "--", x]), ("--workers float", ["--workers", "1.5", "--", x]),
        ("--ps -2", ["--ps", "-2", "--", x]), ("--ps x", ["--ps", "x"]),
        ("--timeout nan", ["--timeout", "nan", "--", x]), ("--timeout inf", ["--timeout", "inf", "--", x]),
        ("--timeout -1", ["--timeout", "-1", "--", x]), ("--timeout 0", ["--timeout", "0", "--", x]),
        ("--timeout 1e400", ["--timeout", "1e400", "--", x]), ("--timeout text", ["--timeout", "soon", "--", x]),
        ("--grace nan", ["--grace", "nan", "--", x]), ("--grace -1", ["--grace", "-1", "--", x]),
        ("--connect-timeout inf", ["--connect-timeout", "inf", "--", x]),
        ("--max-restarts -1", ["--max-restarts", "-1", "--", x]), ("--max-restarts huge", ["--max-restarts", BIG]),
        ("--backend nope", ["--backend", "nope", "--", x]), ("--backend long", ["--backend", "b" * 10000]),
        ("--network sideways", ["--network", "sideways", "--", x]), ("no command", ["--workers", "2"]),
        ("only --", ["--"]), ("--task without --cluster", ["--task", "worker:0", "--", x]),
        ("--cluster with --workers", ["--cluster", "/dev/null", "--workers", "2", "--", x]),
        ("--address with tf", ["--address", "h:1", "--", x]), ("-np with tf", ["-np", "2", "--", x]),
        ("--env with tf", ["--env", "PATH", "--", x]),
        ("--env bad name", ["--backend", "ray", "--env", "A B", "--dry-run", "--", x]),
        ("--env long name", ["--backend", "ray", "--env", "A" * 5000, "--dry-run", "--", x]),
        ("--env unset", ["--backend", "horovod", "--env", "TFACCEL_SURELY_UNSET_24", "--dry-run", "--", x]),
        ("--env TF_CONFIG", ["--backend", "ray", "--env", "TF_CONFIG", "--dry-run", "--", x]),
        ("ray with --ps", ["--backend", "ray", "--ps", "1", "--dry-run", "--", x]),
        ("ray --workers 0", ["--backend", "ray", "--workers", "0", "--dry-run", "--", x]),
        ("ray empty address", ["--backend", "ray", "--address", " ", "--dry-run", "--", x]),
        ("horovod with --workers", ["--backend", "horovod", "--workers", "2", "--dry-run", "--", x]),
        ("horovod -np 0", ["--backend", "horovod", "-np", "0", "--dry-run", "--", x]),
        ("horovod -np huge", ["--backend", "horovod", "-np", BIG, "--dry-run", "--", x]),
        ("horovod bad hosts", ["--backend", "horovod", "-H", "a b:2", "--dry-run", "--", x]),
        ("horovod hosts 0 slots", ["--backend", "horovod", "-H", "a:0", "--dry-run", "--", x]),
        ("horovod repeated host", ["--backend", "horovod", "-H", "a:1,a:1", "--dry-run", "--", x]),
        ("horovod too few slots", ["--backend", "horovod", "-np", "4", "-H", "a:1", "--dry-run", "--", x]),
        ("horovod huge host list", ["--backend", "horovod", "-H", ",".join(["h:1"] * 20000), "--dry-run", "--", x]),
        ("horovod --gloo-timeout 0", ["--backend", "horovod", "--gloo-timeout", "0", "--dry-run", "--", x]),
        ("per-host task not in cluster", ["--cluster", "{file}", "--task", "worker:9", "--dry-run", "--", x]),
        ("per-host task 5000 digits", ["--cluster", "{file}", "--task", "worker:" + BIG, "--dry-run", "--", x]),
        ("per-host task garbage", ["--cluster", "{file}", "--task", "\x1b[31m" * 100, "--dry-run", "--", x]),
        ("per-host with --network", ["--cluster", "{file}", "--task", "worker:0", "--network", "host", "--", x]),
        ("script not found", ["--workers", "1", "--dry-run", "--", "no_such_script_24.py"]),
        ("unknown option", ["--frobnicate", "--", x]),
    ]
    tf_config = [
        ("--format xml", ["{file}", "--format", "xml"]), ("--task garbage", ["{file}", "--task", "w" * 5000]),
        ("--task negative", ["{file}", "--task", "worker:-1"]), ("--task huge", ["{file}", "--task", "worker:" + BIG]),
        ("--task unknown role", ["{file}", "--task", "boss:0"]), ("--task out of range", ["{file}", "--task",
                                                                                            "worker:2"]),
        ("--task and --all", ["{file}", "--task", "worker:0", "--all"]),
        ("--tfjob without image", ["{file}", "--tfjob", "job"]),
        ("--tfjob bad name", ["{file}", "--tfjob", "Bad_Name", "--image", "i"]),
        ("--tfjob long name", ["{file}", "--tfjob", "a" * 10000, "--image", "i"]),
        ("--tfjob image with spaces", ["{file}", "--tfjob", "job", "--image", "a b"]),
        ("--tfjob --format env", ["{file}", "--tfjob", "job", "--image", "i", "--format", "env"]),
        ("--image without --tfjob", ["{file}", "--image", "i"]),
        ("--namespace without --tfjob", ["{file}", "--namespace", "n" * 5000]),
        ("command without --tfjob", ["{file}", "--", "python", "train.py"]),
        ("no file no env", []), ("--slurm-port text", ["--slurm-port", "x"]),
        ("two files", ["{file}", "{file}"]),
    ]
    other = [
        ("unknown verb", ["frobnicate"]), ("unknown verb long", ["v" * 10000]),
        ("fit --epochs x", ["fit", "--epochs", "x"]), ("fit --dataset nope", ["fit", "--dataset", "nope"]),
        ("fit --learning-rate text", ["fit", "--learning-rate", "fast"]),
        ("fit --scale-learning-rate cubic", ["fit", "--scale-learning-rate", "cubic"]),
        ("fit --global-batch-size huge text", ["fit", "--global-batch-size", "x" * 5000]),
        ("fit --warmup-epochs text", ["fit", "--warmup-epochs", "w"]),
        ("fit --steps-per-epoch float", ["fit", "--steps-per-epoch", "1.5"]),
        ("fit unknown option", ["fit", "--frobnicate"]),
        ("env unknown option", ["env", "--yaml"]), ("tf-config unknown option", ["tf-config", "--xyz"]),
        ("bench unknown option", ["bench", "--frobnicate"]), ("memory unknown option", ["memory", "--frobnicate"]),
    ]
    out = [_c(f"launch {name}", ["launch", *argv], file=VALID) for name, argv in launch]
    out += [_c(f"tf-config {name}", ["tf-config", *argv], file=VALID) for name, argv in tf_config]
    out += [_c(name, argv) for name, argv in other]
    return out


def all_cases() -> List[Case]:
    cases = _reader_cases() + _slurm_cases() + _cli_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


# ------------------------------------------------------------------------------------------------- running
@dataclasses.dataclass
class Outcome:
    code: object
    stderr: str
    stdout: str
    seconds: float  # CPU time of the thread that ran it (what the case costs, whatever else the machine runs)
    peak_mb: float
    wall: float = 0.0  # wall-clock seconds


def materialise(case: Case, directory: Path) -> List[str]:
    """The case's argv with ``{file}`` replaced by a file holding ``case.file`` in ``directory``."""
    if case.file is None:
        return list(case.argv)
    path = directory / f"cluster{abs(hash(case.name)) % 10**12}{case.suffix}"
    data = case.file.encode("utf-8", "surrogatepass") if isinstance(case.file, str) else case.file
    path.write_bytes(data)
    return [str(path) if word == "{file}" else word for word in case.argv]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> Optional[int]:
    """Resets this process's peak RSS (Linux ``clear_refs`` 5) and returns the RSS in kB; None where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _status_kb("VmRSS")
    except OSError:
        return None


def run_case(case: Case, directory: Path) -> Outcome:
    """Runs ``tfaccel ARGV`` in this process with the case's environment; stdout/stderr captured.

    Memory: how far the process's peak RSS rose above its RSS before the case (every allocation, C ones
    included); where the peak cannot be reset, the peak of Python's allocations (``tracemalloc``, slower).
    """
    from tfaccel.cli.main import main

    argv = materialise(case, directory)
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(CLUSTER_ENV_PREFIXES):
            del os.environ[key]
    os.environ.update(dict(case.env))
    err, out = io.StringIO(), io.StringIO()
    base_kb = _reset_peak_rss()
    if base_kb is None:
        tracemalloc.start()
    began, began_cpu = time.perf_counter(), time.thread_time()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code: object = main(argv)
            except SystemExit as exc:
                code = exc.code
            except Exception as exc:  # noqa: BLE001 - what the corpus exists to find
                code = f"raised {type(exc).__name__}"
                err.write("Traceback (in-process): " + "".join(traceback.format_exception_only(exc)))
    finally:
        wall, seconds = time.perf_counter() - began, time.thread_time() - began_cpu
        if base_kb is None:
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        else:
            peak = (_status_kb("VmHWM") - base_kb) / 1024
        os.environ.clear()
        os.environ.update(saved)
    return Outcome(code, err.getvalue(), out.getvalue(), seconds, peak, wall)


def problems(outcome: Outcome) -> List[str]:
    """What is wrong with an outcome: not exit 2, not exactly one error line, a traceback, too slow or too big."""
    found = []
    if outcome.code != 2:
        found.append(f"exit code {outcome.code!r}, expected 2")
    lines = outcome.stderr.splitlines()
    errors = [line for line in lines if re.match(r"^tfaccel( [\w-]+)?: error: ", line)]
    others = [line for line in lines if line not in errors and not re.match(r"^tfaccel (INFO|WARNING): ", line)]
    if len(errors) != 1 or others or not outcome.stderr.endswith("\n"):
        found.append(f"{len(errors)} error line(s) and {len(others)} other line(s), expected one error line "
                     f"(and tfaccel's log lines): {outcome.stderr[:300]!r}")
    if "Traceback" in outcome.stderr or "Error:" in outcome.stderr.split(": error: ", 1)[0]:
        found.append("a traceback")
    if max(map(len, lines), default=0) > 1000:
        found.append(f"an error line of {max(map(len, lines))} characters (a value is shown up to ~200)")
    if outcome.seconds > MAX_SECONDS:
        found.append(f"took {outcome.seconds:.2f} s of CPU (limit {MAX_SECONDS:g})")
    if outcome.peak_mb > MAX_MB:
        found.append(f"allocated {outcome.peak_mb:.0f} MB (limit {MAX_MB:g})")
    return found


def tally(directory: Path) -> Dict[str, object]:
    """Runs every case; the count, the slowest and the largest, and every case with a problem."""
    cases = all_cases()
    worst_s, worst_wall, worst_mb, failed = (0.0, ""), (0.0, ""), (0.0, ""), []
    for case in cases:
        outcome = run_case(case, directory)
        worst_s = max(worst_s, (outcome.seconds, case.name))
        worst_wall = max(worst_wall, (outcome.wall, case.name))
        worst_mb = max(worst_mb, (outcome.peak_mb, case.name))
        issues = problems(outcome)
        if issues:
            failed.append((case.name, issues))
    return {"cases": len(cases), "max_seconds": worst_s, "max_wall": worst_wall, "max_mb": worst_mb, "failed": failed}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = tally(Path(tmp))
    failed: list = result["failed"]  # type: ignore[assignment]
    slowest: tuple = result["max_seconds"]  # type: ignore[assignment]
    largest: tuple = result["max_mb"]  # type: ignore[assignment]
    for name, issues in failed:
        print(f"FAIL {name}: {'; '.join(issues)}")
    wall: tuple = result["max_wall"]  # type: ignore[assignment]
    print(f"{result['cases']} cases; slowest {slowest[0]:.3f} s of CPU ({slowest[1]}), {wall[0]:.3f} s wall "
          f"({wall[1]}); largest {largest[0]:.1f} MB ({largest[1]}); {len(failed)} failed")
