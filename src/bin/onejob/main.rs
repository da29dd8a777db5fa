//! `onejob`: the local server and its tools. One file per command family: [`serve`], [`qualify`] (and
//! `providers`), [`remote`] (`jobs` and `attempts` on a running server, over the library's client); [`storage`] opens
//! the store and the config they share, and [`error`] is the one error they stop with.

mod error;
mod qualify;
mod remote;
mod serve;
mod storage;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use onejob::config::env;

use error::CliError;
use remote::{AttemptsCommand, EndpointCommand, JobsCommand, Remote};
use storage::{Storage, dynamodb};

/// The local server allocates small and often (requests, rows, JSON): mimalloc spends less on it than the system
/// allocator (BENCHMARKS.md, section 1). The Lambda functions keep the system's, for their size.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "onejob", version, about = "One job per user intent.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API, the worker and the sweeper in one process: on the embedded SQLite store by default.
    Serve {
        #[command(flatten)]
        storage: Storage,
        /// Address to listen on. Without configured tokens, only a loopback address is allowed.
        #[arg(long, env = env::ADDR, default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
    },
    /// Check a provider against a contract: every sample input, --runs times, through the real client. The
    /// evidence is stored with the jobs; automatic failover goes only to a qualified provider.
    /// Exit status: 0 qualified, 1 not qualified, 2 could not run.
    Qualify {
        /// The contract, as name@version (e.g. summarize@1).
        #[arg(required_unless_present = "stale")]
        contract: Option<String>,
        /// The provider's name in the config.
        #[arg(required_unless_present = "stale")]
        provider: Option<String>,
        /// Qualify again every pair that passed and is suspected in production (another model, broken contracts)
        /// or older than qualification_max_age_days.
        #[arg(long, conflicts_with_all = ["contract", "provider"])]
        stale: bool,
        /// Runs of each sample input.
        #[arg(long, default_value_t = onejob::providers::qualify::DEFAULT_RUNS, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        #[command(flatten)]
        storage: Storage,
    },
    /// Check a config as a deployed function reads it — the providers it names and no demo ones, its contract
    /// files beside it, every chain on configured providers — and print the fingerprints its functions' /healthz
    /// and first log line will show, and the stack's `BedrockModelArns` for its Bedrock providers (in
    /// `AWS_REGION`'s region where a provider names none). Run it before `sam deploy`.
    Check {
        /// The config file: the config layer's onejob.toml.
        #[arg(long, env = env::CONFIG, default_value = "config/onejob.toml")]
        config: std::path::PathBuf,
    },
    /// List the configured providers with their qualification standing per contract.
    Providers {
        #[command(flatten)]
        storage: Storage,
    },
    /// Jobs on a running server: create (with retries under one key), get, list, cancel, watch, events.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// A job's attempts on a running server: retry by hand, cancel.
    Attempts {
        #[command(subcommand)]
        command: AttemptsCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// What your jobs cost on a running server, by day and contract (their bills added up): from the first of
    /// this month to today unless --from and --to say otherwise.
    Usage {
        /// The first day, YYYY-MM-DD.
        #[arg(long)]
        from: Option<chrono::NaiveDate>,
        /// The last day, YYYY-MM-DD.
        #[arg(long)]
        to: Option<chrono::NaiveDate>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Your completion events' endpoint on a running server: set, show, remove.
    Endpoint {
        #[command(subcommand)]
        command: EndpointCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// Manage the DynamoDB table.
    Table {
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell), e.g.
    /// `onejob completions bash > ~/.local/share/bash-completion/completions/onejob`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (roff): `onejob.1` and one per subcommand (`onejob-jobs-create.1`, …) into DIR.
    Man {
        /// Where to write them, e.g. ~/.local/share/man/man1.
        dir: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum TableCommand {
    /// Create the table with its indexes, TTL and point-in-time recovery; does nothing if it exists.
    Create {
        #[arg(long, env = env::TABLE)]
        table: String,
    },
}

/// `onejob check`.
fn check(path: &std::path::Path) -> Result<ExitCode, CliError> {
    let config = onejob::config::Config::load_deployed(path)?;
    let contracts = config.contracts()?;
    let fingerprint = config.origin.map(|o| o.fingerprint.to_string());
    println!(
        "config {}: {}",
        path.display(),
        fingerprint.unwrap_or_default()
    );
    for contract in contracts.iter() {
        let chain: Vec<&str> = contract.providers.iter().map(|p| p.as_str()).collect();
        println!("  {} on {}", contract.reference, chain.join(" → "));
    }
    println!("contracts: {}", contracts.fingerprint());
    // What the stack's functions must be allowed to invoke: the template's BedrockModelArns.
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "*".into());
    let arns: Vec<String> = (config.providers.values())
        .flat_map(|p| p.kind.kind().invoke_arns(&region))
        .collect();
    if !arns.is_empty() {
        println!("BedrockModelArns={}", arns.join(","));
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    onejob::telemetry::init();
    let Cli { command } = Cli::parse();
    let outcome = match command {
        Command::Serve { storage, addr } => serve::serve(addr, &storage)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(CliError::from),
        Command::Qualify {
            contract,
            provider,
            stale,
            runs,
            storage,
        } => match (contract, provider) {
            (Some(contract), Some(provider)) if !stale => {
                qualify::run_qualify(&contract, &provider, runs, &storage).await
            }
            _ => qualify::requalify_stale(runs, &storage).await,
        },
        Command::Check { config } => check(&config),
        Command::Providers { storage } => qualify::list_providers(&storage)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Jobs { command, remote } => {
            remote::jobs(command, &remote).await.map(ExitCode::from)
        }
        Command::Attempts { command, remote } => {
            remote::attempts(command, &remote).await.map(ExitCode::from)
        }
        Command::Usage { from, to, remote } => {
            remote::usage(from, to, &remote).await.map(ExitCode::from)
        }
        Command::Endpoint { command, remote } => {
            remote::endpoint(command, &remote).await.map(ExitCode::from)
        }
        Command::Table {
            command: TableCommand::Create { table },
        } => match dynamodb(table.clone()).await.create_table().await {
            Ok(created) => {
                let done = if created { "created" } else { "already exists" };
                println!("table {table}: {done}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(e.into()),
        },
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "onejob", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir } => clap_mangen::generate_to(Cli::command(), &dir)
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| CliError::Usage(format!("cannot write to {}: {e}", dir.display()))),
    };
    // The spans of the last moments, if traces are exported.
    onejob::telemetry::flush().await;
    outcome.unwrap_or_else(|e| {
        eprintln!("onejob: {}", e.message());
        ExitCode::from(e.exit_code())
    })
}
