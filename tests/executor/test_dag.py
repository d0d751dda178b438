"""The DAG built from references: cycles, duplicate names, identical steps, bad names."""

from dataclasses import dataclass, field

import pytest

from executor import Step, VoyageError, output_of, step_type


@dataclass(frozen=True)
class C:
    inputs: tuple = ()
    extra: dict = field(default_factory=dict)
    n: int = 0


@step_type(version="1", name="dag_t")
def t(config: C, ctx) -> None:
    pass


def test_references_anywhere_make_edges_and_order_is_topological():
    from executor.dag import build_dag

    a = Step("a", t, C(n=1))
    b = Step("b", t, C(n=2))
    c = Step("c", t, C(inputs=(output_of(a),), extra={"deep": [{"x": output_of(b, "f.txt")}]}))
    dag = build_dag([c])
    assert [n.name for n in dag] == ["a", "b", "c"]
    assert {d.name for d in dag["c"].deps} == {"a", "b"}
    assert dag.upstream(["c"]) == {"a", "b", "c"}
    assert dag.downstream(["a"]) == {"a", "c"}


def test_identical_steps_are_one_node():
    from executor.dag import build_dag

    a1 = Step("a", t, C(n=1))
    a2 = Step("a", t, C(n=1))
    dag = build_dag([Step("b", t, C(inputs=(output_of(a1),))), Step("c", t, C(inputs=(output_of(a2),)))])
    assert len(dag) == 3


def test_one_name_two_digests_is_an_error_naming_both_places():
    from executor.dag import build_dag

    a1 = Step("a", t, C(n=1))
    a2 = Step("a", t, C(n=2))
    with pytest.raises(VoyageError, match=r"two different steps are named 'a': .*test_dag.py:\d+ and .*test_dag.py:\d+"):
        build_dag([a1, a2])


def test_a_cycle_is_an_error_naming_the_steps_in_it():
    from executor.dag import build_dag

    x = Step("x", t, C(inputs=(output_of("z"),)))
    y = Step("y", t, C(inputs=(output_of(x),)))
    z = Step("z", t, C(inputs=(output_of(y),)))
    with pytest.raises(VoyageError, match=r"cycle between steps: (x -> y -> z -> x|y -> z -> x -> y|z -> x -> y -> z)"):
        build_dag([x, y, z, Step("w", t, C())])


def test_reference_to_an_unknown_name():
    from executor.dag import build_dag

    with pytest.raises(VoyageError, match="refers to unknown step 'nope'"):
        build_dag([Step("x", t, C(inputs=(output_of("nope"),)))])


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../b", "sp ace", "semi;colon", "", "a//b", "é"])
def test_bad_step_names_are_refused(name):
    with pytest.raises(VoyageError, match="bad step name"):
        Step(name, t, C())


def test_good_names():
    for name in ("tokenized/fineweb-edu", "a.b_c-1/x", "v1.2"):
        Step(name, t, C())


def test_config_must_be_a_dataclass_instance():
    with pytest.raises(VoyageError, match="config must be a dataclass instance"):
        Step("x", t, {"a": 1})


def test_deep_chain_has_no_recursion_limit():
    from executor.dag import build_dag

    prev = Step("s0", t, C())
    for i in range(1, 3000):
        prev = Step(f"s{i}", t, C(inputs=(output_of(prev),)))
    dag = build_dag([prev])
    assert len(dag) == 3000 and dag.nodes[0].name == "s0"


def test_origin_names_the_line_of_each_step_in_a_long_generated_voyage():
    """Each Step's origin is its own line, the first and last of 3,000 built in one generated
    function, a call spread over two lines, and a second function's steps after it (the line
    table is read once per code object, not once per Step: it was O(N^2))."""
    lines = ["def build():", "    s = []"]
    for i in range(3000):
        lines += [f"    s.append(Step('gen/s{i}', t,", f"                  C(n={i})))"]
    lines += ["    return s", "", "def other():", "    return Step('other', t, C())"]
    ns = {"Step": Step, "t": t, "C": C}
    exec(compile("\n".join(lines) + "\n", "/gen/voyage.py", "exec"), ns)
    steps = ns["build"]()
    assert [steps[i].origin for i in (0, 1, 2999)] == ["/gen/voyage.py:3", "/gen/voyage.py:5", "/gen/voyage.py:6001"]
    assert ns["other"]().origin == "/gen/voyage.py:6006"
    with pytest.raises(VoyageError, match=r"/gen/voyage.py:1: bad step name"):
        exec(compile("Step('../x', t, C())", "/gen/voyage.py", "exec"), ns)


def test_a_steps_origin_is_worked_out_when_asked_and_copies_carry_its_text():
    """Building a Step keeps where it was built; the line is read from the code's line table only
    when an error message (or this test) asks, and a copy or a pickle carries the text."""
    import copy

    from executor import step as step_mod

    ns = {"Step": Step, "t": t, "C": C}
    exec(compile("\n\nmade = Step('late', t, C())\n", "/gen/late.py", "exec"), ns)
    made = ns["made"]
    assert not isinstance(made._origin, str)  # not worked out yet
    step_mod._LINE_TABLES.clear()
    assert made.__getstate__()[1]["_origin"] == "/gen/late.py:3"  # what pickle and copy take
    twin = copy.deepcopy(made)
    assert twin.origin == made.origin == "/gen/late.py:3" and isinstance(twin._origin, str)
    assert twin.name == "late" and twin.type.key == t.key and twin.config == made.config
