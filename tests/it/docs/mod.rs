//! The documentation is tested, so it cannot drift from the product:
//! README.md and every `docs/*.md` page (read from `DEDUPQ_DOCS_ROOT`, a
//! directory holding a README.md and a docs/, if set; else the repository).
//!
//! How a fenced block is marked, by the words after its language:
//!
//! * ` ```toml ` is a whole configuration for `dedupq run`: written to a
//!   file and loaded by `Settings::load`, the loader of `dedupq --config`
//!   (defaults, then the file, then validation: an unknown setting or a bad
//!   value fails), then checked with `Settings::validate_for_run`.
//! * ` ```toml fragment ` is part of a configuration (one section, an
//!   example of one setting): loaded the same way, merged over the
//!   defaults and validated, without `validate_for_run`.
//! * ` ```console ` shows commands (lines starting `$ `) and their output
//!   (the other lines). Every command that runs `dedupq` must parse: the
//!   real binary with its arguments and `--help` appended exits 0. So must
//!   every `dedupq …` line of a ` ```sh ` block.
//! * ` ```console runnable ` is also run, command by command, with `bash`
//!   in a scratch directory, `dedupq` being the built binary, against the
//!   real PostgreSQL in a schema of its own (`DEDUPQ__STORE__SCHEMA`): each
//!   command must exit 0, and the output lines shown under it must appear
//!   in what it printed, in that order. Keep these cheap; a block that
//!   needs a whole deployment stays unmarked.
//!
//! Every relative link and `#anchor` must name an existing file and
//! heading (GitHub's anchors), and README.md fits on a screen or two.

mod commands;
mod console_blocks;
mod links;
mod pages;
mod toml_blocks;
