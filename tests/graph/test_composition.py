"""The graph's shape, persistence and use inside larger agent systems."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from stitch_graph import (
    StitchContext,
    as_tool,
    build_agent_graph,
    build_stitch_graph,
    create_stitch_graph,
    load_task,
    result_of,
    sqlite_checkpointer,
)
from stitch_graph.agents.finalize import GRAPH_NAME, RESULT_KEY
from stitch_graph.agents.verifier import verifier_node
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, call, passed
from tests.graph.test_routing import KERNEL, PROBLEM, plan_answer, program

SNAPSHOT = Path(__file__).with_name("graph.mmd")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")


def test_graph_shape_is_pinned():
    drawn = create_stitch_graph().get_graph().draw_mermaid(with_styles=False)
    assert drawn == SNAPSHOT.read_text()


def test_each_agent_builds_alone():
    def edges(agent):
        graph = build_agent_graph(agent).compile().get_graph()
        return {(e.source, e.target) for e in graph.edges}

    assert edges("coder") == {
        ("__start__", "coder"),
        ("coder", "coder_tools"),
        ("coder_tools", "coder"),
        ("coder", "__end__"),
    }
    assert edges("planner") == {("__start__", "planner"), ("planner", "__end__")}


@needs_nvcc
def test_resume_continues_from_the_last_completed_step(tmp_path):
    task = load_task(PROBLEM, name="add_relu")
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(script=[program()])
    executor = ScriptedExecutor([passed()])
    ctx = StitchContext(
        planner_model=planner,
        coder_model=coder,
        executor=executor,
        use_knowledge=False,
        max_tool_calls=0,
    )
    calls = {"n": 0}

    def flaky_verifier(state, runtime):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt("killed")
        return verifier_node(state, runtime)

    db = tmp_path / "run.sqlite"
    config = {"configurable": {"thread_id": "t1"}}
    graph = build_stitch_graph(verifier=flaky_verifier).compile(
        checkpointer=sqlite_checkpointer(db)
    )
    with pytest.raises(KeyboardInterrupt):
        graph.invoke({"task": task}, config, context=ctx)
    # a new process would open the same file: a fresh saver and graph
    graph = build_stitch_graph(verifier=flaky_verifier).compile(
        checkpointer=sqlite_checkpointer(db)
    )
    assert graph.get_state(config).next == ("verifier",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # restoring artefacts must not warn
        result = graph.invoke(None, config, context=ctx)
    assert result["report"].outcome == "verified"
    assert len(planner.prompts) == 1 and len(coder.prompts) == 1, "no step was redone"


def scripted_context(**settings) -> StitchContext:
    """Scripted Planner and Coder, a scripted GPU that passes the program (1 ms vs 2 and 1.5)."""
    return StitchContext(
        planner_model=ScriptedChatModel(script=[plan_answer()]),
        coder_model=ScriptedChatModel(script=[program()]),
        executor=ScriptedExecutor([passed()]),
        use_knowledge=False,
        max_tool_calls=0,
        **settings,
    )


def assert_verified_result(result: dict) -> None:
    """The structured result of the scripted run: plain data, every field a supervisor reads."""
    assert json.loads(json.dumps(result)) == result, "plain JSON data"
    assert result["graph"] == GRAPH_NAME
    assert result["outcome"] == "verified" and result["partial"] is False
    assert result["correctness"]["correct"] is True and result["correctness"]["trials"] == 3
    assert result["speedup_vs_eager"] == pytest.approx(2.0)
    assert result["speedup_vs_compile"] == pytest.approx(1.5)
    assert result["ops_left_to_pytorch"] == {}
    assert result["program"]["kernel_source"] == KERNEL


def test_the_graph_is_named_for_its_contract():
    assert GRAPH_NAME == "stitch_graph"
    assert create_stitch_graph().name == GRAPH_NAME
    assert create_stitch_graph(name="cuda_team").name == "cuda_team"
    assert set(create_stitch_graph().get_output_jsonschema()["properties"]) == {
        "messages",
        "report",
        "result",
    }


@needs_nvcc
def test_graph_as_a_node_of_a_parent_graph():
    parent = StateGraph(MessagesState, context_schema=StitchContext)
    parent.add_node("cuda_team", create_stitch_graph())
    parent.add_edge(START, "cuda_team")
    request = HumanMessage(content=f"Make this fast:\n```python\n{PROBLEM}\n```")
    result = parent.compile().invoke({"messages": [request]}, context=scripted_context())
    assert [m.type for m in result["messages"]] == ["human", "ai"]
    closing = result["messages"][-1]
    assert closing.name == GRAPH_NAME and "verified" in closing.content
    assert_verified_result(closing.additional_kwargs[RESULT_KEY])
    assert result_of(result) == closing.additional_kwargs[RESULT_KEY]


@needs_nvcc
def test_the_output_and_the_run_folder_name_the_program_files(tmp_path):
    output = create_stitch_graph().invoke(
        {"task": load_task(PROBLEM, name="add_relu")},
        context=scripted_context(run_dir=str(tmp_path / "run")),
    )
    result = output["result"]
    assert_verified_result(result)
    assert result == output["messages"][-1].additional_kwargs[RESULT_KEY]
    assert result["run_dir"] == str((tmp_path / "run").resolve())
    assert {"program.cu", "host.py", "report.md", "report.json"} <= set(result["files"])
    assert Path(result["files"]["program.cu"]).read_text() == KERNEL


@needs_nvcc
def test_graph_as_a_tool_of_a_tool_calling_agent(tmp_path):
    from langchain.agents import create_agent

    tool = as_tool(context=scripted_context(), run_dir=tmp_path / "runs")
    supervisor = ScriptedChatModel(
        script=[call("optimize_with_cuda", problem_source=PROBLEM), AIMessage(content="done")]
    )
    agent = create_agent(supervisor, tools=[tool])
    result = agent.invoke({"messages": [HumanMessage(content="optimise my model")]})
    tool_reply = result["messages"][2]
    assert tool_reply.type == "tool"
    brief = json.loads(tool_reply.content)
    assert brief["outcome"] == "verified" and "program" not in brief, "sources stay out"
    assert brief["speedup_vs_compile"] == pytest.approx(1.5)
    assert Path(brief["files"]["program.cu"]).read_text() == KERNEL
    assert Path(brief["run_dir"]).parent == (tmp_path / "runs").resolve()
    assert_verified_result(tool_reply.artifact)
