"""One flag spelling rule across every nnhal command (issue 33, item 3c), read off the real parser
(nnhal.cli.build_parser): TFLite's names keep TFLite's underscores, nnhal's own use dashes; a
name is spelled the same on every command that has it; every flag also parses under the other
separator; the service's --cache-dir and the delegate's --delegate_serialize_dir stay apart."""
from __future__ import annotations

import argparse

import pytest

from nnhal.cli import TFLITE_TOOLS, build_parser
from nnhal.tool_support import TFLITE_FLAGS, other_separators


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


COMMANDS = _commands()
FLAGS = [(name, flag) for name, p in COMMANDS.items() for a in _flags(p) for flag in a.option_strings]


def _required_argv(name: str, p: argparse.ArgumentParser) -> list[str]:
    """The command and what it cannot parse without (its positionals, its required flags)."""
    argv = [name]
    for a in p._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[0], "m.tflite"]
        elif not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            argv.append(a.choices[0] if a.choices else "m.tflite")
    return argv


def _with_value(flag: str, a: argparse.Action) -> list[str]:
    """``flag`` with a value its action takes: --flag, or --flag=VALUE."""
    if a.nargs == 0:
        return [flag]
    value = (a.choices[0] if a.choices else
             {int: "7", float: "1.5"}.get(a.type, "true" if getattr(a.type, "__name__", "") == "flag_bool" else "v"))
    return [f"{flag}={value}"]


@pytest.mark.parametrize("name, flag", FLAGS, ids=[f"{n} {f}" for n, f in FLAGS])
def test_spelling_rule(name, flag):
    """TFLite's names as TFLite spells them, so its command lines work as is; ours with dashes."""
    assert flag in TFLITE_FLAGS or "_" not in flag, \
        f"nnhal {name} {flag}: nnhal's own flags are spelled with dashes ({flag.replace('_', '-')})"


def test_a_name_is_spelled_the_same_on_every_command():
    spellings: dict[str, set[str]] = {}
    for _, flag in FLAGS:
        spellings.setdefault(flag.replace("_", "-"), set()).add(flag)
    assert {k: v for k, v in spellings.items() if len(v) > 1} == {}


def test_a_meaning_has_one_canonical_spelling():
    """Flags with one dest on several commands lead with the same spelling, unless TFLite's own tools
    name it (benchmark_model's --graph, inference_diff's --model_file; --num_threads vs serve's
    --threads, which are not even one meaning)."""
    canonical: dict[str, set[str]] = {}
    for p in COMMANDS.values():
        for a in _flags(p):
            canonical.setdefault(a.dest, set()).add(a.option_strings[0])
    mixed = {dest: names for dest, names in canonical.items() if len(names - TFLITE_FLAGS) > 1}
    assert mixed == {}


@pytest.mark.parametrize("name, flag", FLAGS, ids=[f"{n} {f}" for n, f in FLAGS])
def test_both_separators_parse(name, flag):
    p = COMMANDS[name]
    action = p._option_string_actions[flag]
    base = _required_argv(name, p)
    want, extras = build_parser().parse_known_args(base + _with_value(flag, action))
    assert extras == []
    for other in other_separators(flag):
        got, extras = build_parser().parse_known_args(base + _with_value(other, action))
        assert extras == [] and getattr(got, action.dest) == getattr(want, action.dest), other


def test_the_two_cache_directories_are_named_apart():
    """serve and cache: the service's storage, --cache-dir. The tools: the delegate's cache_dir, a key
    mixed into the token, --delegate_serialize_dir; its old --cache_dir still works there, but the
    service's spelling --cache-dir does not: it would silently mean the other thing."""
    for name in ("serve", "cache"):
        flag = COMMANDS[name]._option_string_actions["--cache-dir"]
        assert flag.option_strings == ["--cache-dir"] and "service's" in flag.help
    for name in TFLITE_TOOLS:
        argv = _required_argv(name, COMMANDS[name])
        args, extras = build_parser().parse_known_args(argv + ["--delegate_serialize_dir", "d"])
        assert args.cache_dir == "d" and extras == []
        assert "serve --cache-dir" in COMMANDS[name]._option_string_actions["--delegate_serialize_dir"].help
        args, extras = build_parser().parse_known_args(argv + ["--cache_dir", "d"])
        assert args.cache_dir == "d" and extras == []
        _, extras = build_parser().parse_known_args(argv + ["--cache-dir", "d"])
        assert extras == ["--cache-dir", "d"]
        assert "--cache_dir" not in COMMANDS[name].format_usage()  # its help says "was --cache_dir"


def test_old_tool_spellings_still_work():
    args, extras = build_parser().parse_known_args([
        "benchmark", "--graph", "m", "--service_address", "unix:/s", "--tls_ca_file", "ca", "--tls_cert_file", "c",
        "--tls_key_file", "k", "--cache_token", "t", "--runs", "2"])
    assert extras == [] and (args.service_address, args.tls_ca_file, args.tls_cert_file, args.tls_key_file,
                             args.cache_token, args.runs) == ("unix:/s", "ca", "c", "k", "t", 2)
    args = build_parser().parse_args(["report", "--model_file", "m", "--model_explorer", "o", "--benchmark_json",
                                      "b"])
    assert (args.model_explorer, args.benchmark_json) == ("o", "b")


def test_an_abbreviation_is_not_ambiguous_between_two_spellings_of_one_flag():
    assert build_parser().parse_args(["serve", "--no"]).no_cache is True
    assert build_parser().parse_args(["cache", "ls", "--cache", "d"]).cache_dir == "d"
