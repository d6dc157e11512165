"""Run settings and chat models from the command line's arguments, shared by its commands.

``optimize`` and ``bench`` take the same model options; both build their ``StitchContext`` here,
and both check every model before anything runs, so a wrong name or a missing key is one line.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from stitch_graph.agents.context import StitchContext

__all__ = ["add_model_options", "check_models", "context_from_args", "model_spec"]


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model options ``context_from_args`` and ``check_models`` read."""
    parser.add_argument(
        "--model", help="chat model for every agent, e.g. openai:gpt-4.1 (default: rules)"
    )
    for role in ("planner", "coder", "verifier"):
        parser.add_argument(
            f"--{role}-model", help=f"chat model for the {role} only ('rules': rule-based)"
        )
    parser.add_argument("--base-url", help="OpenAI-compatible server URL (uses ChatOpenAI)")
    parser.add_argument(
        "--structured-method",
        default="function_calling",
        choices=["function_calling", "json_schema", "json_mode"],
    )


def model_spec(name: str | None, base_url: str | None) -> Any:
    """A role's model: ``None`` (rule-based), a provider:model name, or a client for a local
    OpenAI-compatible server at ``base_url``."""
    if name is None:
        return None
    if base_url is None:
        return name
    from langchain_openai import ChatOpenAI

    model = name.split(":", 1)[1] if name.startswith("openai:") else name
    # local servers usually ignore the key, but the client refuses to start without one
    return ChatOpenAI(
        model=model, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none")
    )


def context_from_args(args: argparse.Namespace, out: Path, **extra: Any) -> StitchContext:
    """The run settings the model, budget and profiling options name; ``extra`` adds fields a
    command sets beyond them (``bench``'s per-job timeout)."""

    def pick(role: str) -> Any:
        name = getattr(args, f"{role}_model") or args.model
        return None if name == "rules" else model_spec(name, args.base_url)

    return StitchContext(
        planner_model=pick("planner"),
        coder_model=pick("coder"),
        verifier_model=pick("verifier"),
        structured_output_method=args.structured_method,
        max_rounds=args.max_rounds,
        wall_time_s=args.wall_time,
        tune_budget_s=args.tune_budget,
        gpu_arch=args.arch,
        profile=not args.no_profile,
        use_knowledge=not args.no_knowledge,
        work_dir=str(out / "work"),
        **extra,
    )


def check_models(ctx: StitchContext, args: argparse.Namespace) -> str | None:
    """One line on the first model that cannot be created, with the fix; None when all can.

    Models are created here, before anything runs, so a wrong name or a missing key is answered
    at once instead of after the planner has started (they are cached, so the agents reuse them).
    """
    from stitch_graph.agents.llm import resolve_model

    for role in ("planner", "coder", "verifier"):
        spec = getattr(ctx, f"{role}_model")
        try:
            resolve_model(spec)
        except ValueError as exc:
            cause = " ".join(str(exc.__cause__ or exc).split("\n\n")[0].split())
            flag = f"--{role}-model" if getattr(args, f"{role}_model") else "--model"
            if "infer model provider" in cause:  # its advice names an option the CLI lacks
                provider = str(spec).split(":", 1)[0] if ":" in str(spec) else None
                cause = (
                    f"LangChain knows no chat-model provider {provider!r}"
                    if provider
                    else "no provider given, and LangChain cannot infer one from the name"
                )
            if "api_key" in cause or "API key" in cause or "credentials" in cause.lower():
                fix = (
                    "set the provider's API key (e.g. export OPENAI_API_KEY=...), pass "
                    "--base-url URL for a local OpenAI-compatible server"
                )
            else:
                fix = (
                    "name it provider:model (e.g. openai:gpt-4.1) with a provider LangChain "
                    "knows and its package installed (pip install langchain-PROVIDER)"
                )
            return (
                f"cannot use {flag} {spec}: {cause.rstrip('.')}. Fix: {fix}, or leave the "
                "option out for the rule-based agents."
            )
    return None
