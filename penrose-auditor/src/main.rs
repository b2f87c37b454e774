//! `penrose-auditor`: parses the command line (its definition is `penrose_auditor::cli`) and
//! runs it.

use std::fmt::Display;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use penrose_auditor::cli::{Cli, Command, KeyFiles};
use penrose_auditor::service::{self, ServeOptions};
use penrose_auditor::{AuditorError, InitOptions, Policy, admin, keys};
use penrose_core::paillier::threshold::KeyShare;
use penrose_host::exit::{Exit, finish};
use serde::Serialize;

fn main() -> ExitCode {
    penrose_host::process::init_logging("info");
    let runtime = match penrose_host::exit::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return Exit::Failure.into();
        }
    };
    let result = runtime.block_on(run(Cli::parse()));
    finish(result.map(|()| Exit::Success), exit_code)
}

/// The shared table (`penrose_host::exit`): a refused input (cli.rs says which) is
/// [`Exit::Refused`], a data directory another process holds [`Exit::Unavailable`].
fn exit_code(e: &anyhow::Error) -> Exit {
    let typed = e.downcast_ref::<AuditorError>();
    if typed.is_some_and(AuditorError::is_refusal) {
        Exit::Refused
    } else if typed.is_some_and(AuditorError::is_busy) {
        Exit::Unavailable
    } else {
        Exit::Failure
    }
}

fn print<T: Serialize + Display>(json: bool, value: &T) -> Result<()> {
    Ok(penrose_host::output::print(value, json)?)
}

fn read_key(files: &KeyFiles) -> Result<KeyShare, AuditorError> {
    keys::read_offered(&files.share, &files.public_key, &files.verification_key)
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Init {
            data,
            key,
            aggregator_key,
            instance,
            threshold,
            cap,
            json,
        } => {
            let options = InitOptions {
                share: read_key(&key)?,
                aggregator: keys::read_aggregator_key(&aggregator_key)?,
                policy: Policy::new(threshold, cap)?,
                instance,
            };
            print(json, &admin::init(&data.dir(), options)?)?;
        }
        Command::AddShare { data, key, json } => {
            print(json, &admin::add_share(&data.dir(), &read_key(&key)?)?)?;
        }
        Command::Serve {
            data,
            listen,
            cert,
            key,
            name,
        } => {
            let mut options = ServeOptions::new(data.dir(), listen);
            options.tls = cert.zip(key);
            options.names = name;
            service::run(options).await?;
        }
        Command::Status { data, json } => print(json, &admin::status(&data.dir())?)?,
        Command::Follow {
            data,
            instance,
            json,
        } => print(json, &admin::follow(&data.dir(), instance)?)?,
    }
    Ok(())
}
