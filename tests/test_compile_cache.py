"""The persistent compilation cache: `use_compilation_cache` and `pfedwn --compile-cache`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from pfedwn_jax.cli import main

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp
    import pfedwn_jax

    path = pfedwn_jax.use_compilation_cache(sys.argv[1])
    assert jax.config.jax_compilation_cache_dir == path == sys.argv[1]

    def f(x):  # unrolled, so it takes longer than the cache's 0.1 s threshold to compile
        for i in range(300):
            x = jnp.tanh(x @ x.T + i) @ x
        return x

    jax.jit(f)(jnp.ones((8, 8))).block_until_ready()
    """
)


def test_compiled_programs_are_written_to_the_cache_directory(tmp_path):
    cache = tmp_path / "xla"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], check=True, env=env, timeout=300)
    assert any(cache.iterdir())  # the program is on disk for the next process


def test_cli_flag_with_an_unusable_directory_is_a_one_line_error(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code = main(["--compile-cache", str(not_a_dir), "data", "show", "--clients", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--compile-cache" in err and str(not_a_dir) in err
    assert "Traceback" not in err


def test_compile_cache_without_a_directory_before_the_subcommand(monkeypatch):
    """`pfedwn --compile-cache sweep ...` (the README's line): the subcommand is not taken as
    the optional directory."""
    import pfedwn_jax.cli as cli

    used = []
    monkeypatch.setattr(cli, "use_compilation_cache", used.append)
    assert cli.bare_compile_cache(["--compile-cache", "sweep", "--seeds", "0-15"]) == [
        "--compile-cache=", "sweep", "--seeds", "0-15",
    ]  # fmt: skip
    assert cli.bare_compile_cache(["--compile-cache", "d", "run"]) == [
        "--compile-cache",
        "d",
        "run",
    ]
    assert cli.main(["--compile-cache", "data", "list"]) == 0
    assert used == [None]  # the default directory
