//! `penrose-agent`: parses the command line (its definition is `penrose_agent::cli`), runs the
//! library function behind each subcommand, prints its typed result as text or as `--json`,
//! and maps errors to the exit codes the command line documents.

use std::fmt::Display;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Parser;
use penrose_agent::capture_summary::{self, CaptureRunError};
use penrose_agent::catalogue::CatalogueListing;
use penrose_agent::cli::{Cli, Command};
use penrose_agent::config::{self, AgentConfig, ConfigError};
use penrose_agent::config_check::ConfigCheck;
use penrose_agent::inspect::Inspection;
use penrose_agent::service::{self, ServiceError};
use penrose_agent::status::AgentStatus;
use penrose_agent::trace_fingerprint::fingerprint_trace;
use penrose_host::exit::{Exit, finish};
use serde::Serialize;

fn main() -> ExitCode {
    // The capture's start-up settings and warnings are worth seeing without RUST_LOG.
    penrose_host::process::init_logging("info");
    finish(run(Cli::parse()).map(|()| Exit::Success), exit_code)
}

/// The shared table (`penrose_host::exit`): a missing host prerequisite of capture is
/// [`Exit::Unavailable`], an invalid configuration file [`Exit::Refused`].
fn exit_code(e: &anyhow::Error) -> Exit {
    let missing = e
        .downcast_ref::<CaptureRunError>()
        .is_some_and(CaptureRunError::is_missing_prerequisite)
        || e.downcast_ref::<ServiceError>()
            .is_some_and(ServiceError::is_missing_prerequisite);
    if missing {
        Exit::Unavailable
    } else if e.downcast_ref::<ConfigError>().is_some() {
        Exit::Refused
    } else {
        Exit::Failure
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { config } => {
            service::serve(&config, AgentConfig::load(&config)?)?;
            Ok(())
        }
        Command::Status { config, json } => {
            let config = AgentConfig::load(&config)?;
            print(&AgentStatus::read(&config.state_dir)?, json)
        }
        Command::Inspect { config, json } => {
            let config = AgentConfig::load(&config)?;
            // The text form also shows the tokens held; the JSON form is the reports alone.
            print(&Inspection::read(&config, !json)?, json)
        }
        Command::Config {
            print_default,
            check,
        } => match (print_default, check) {
            (_, Some(path)) => {
                let config = AgentConfig::load(&path)?;
                print!("{}", ConfigCheck::new(&path, &config));
                Ok(())
            }
            (true, None) => {
                print!("{}", config::DEFAULT_FILE);
                Ok(())
            }
            (false, None) => bail!("give --print-default or --check FILE"),
        },
        Command::Fingerprint {
            trace,
            window,
            per_stream,
            json,
        } => print(&fingerprint_trace(&trace, window, per_stream)?, json),
        Command::Catalogue { json } => print(&CatalogueListing::current(), json),
        Command::Capture(args) => print(&capture_summary::capture(&args)?, args.json),
    }
}

/// Prints a result as pretty JSON or as its text form.
fn print<T: Serialize + Display>(result: &T, json: bool) -> Result<()> {
    Ok(penrose_host::output::print(result, json)?)
}
