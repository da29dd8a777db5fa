//! `onejob jobs …`, `onejob attempts …` and `onejob endpoint …`: thin, scriptable commands over [`Client`].
//!
//! Exit status: 0 done (with `--wait` or `watch`: the job succeeded); 1 the job ended failed or cancelled; 2 bad
//! usage; 3 the server refused the request (its problem `code` and `detail` are printed); 4 no answer after every
//! retry, or an answer this client cannot read.

use std::time::Duration;

use chrono::Utc;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use serde_json::Value;

use onejob::client::{Client, Intent, JobSpec, Tries, render};
use onejob::config::env;
use onejob::domain::JobStatus;

use crate::error::CliError;

mod watch;
use watch::{live, on_terminal, watch};

/// The server and the caller.
#[derive(Debug, clap::Args)]
pub(crate) struct Remote {
    /// The onejob server.
    #[arg(
        long,
        env = env::URL,
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
    /// The bearer token (a local server without tokens prints its dev tokens when it starts).
    #[arg(long, env = env::TOKEN, global = true, hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Retries after the first try, for requests that are safe to repeat.
    #[arg(long, default_value_t = 5, global = true)]
    retries: u32,
    /// One try's time limit, in seconds.
    #[arg(long, default_value_t = 30, global = true)]
    timeout: u64,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum JobsCommand {
    /// Create a job: one key per invocation (a UUIDv7) unless --key names one; retried with the same key.
    Create {
        /// The contract, as name@version.
        #[arg(long)]
        contract: String,
        /// The input: JSON text, @file.json, or @- for standard input.
        #[arg(long)]
        input: String,
        /// The provider chain, comma-separated; the contract's default without it.
        #[arg(long, value_delimiter = ',')]
        providers: Option<Vec<String>>,
        /// The idempotency key; send the same one again to retry the same intent.
        #[arg(long)]
        key: Option<String>,
        /// Follow the job until it is settled.
        #[arg(long)]
        wait: bool,
    },
    /// Show a job.
    Get { id: String },
    /// Show the job your idempotency key names (for a client that kept the key and lost the rest); exit 1 if none.
    Find { key: String },
    /// List your jobs, newest first.
    List {
        /// Only jobs with this status.
        #[arg(long, value_parser = job_status())]
        status: Option<JobStatus>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Cancel a job (idempotent; sent under one key per invocation unless --key names one).
    Cancel {
        id: String,
        #[arg(long)]
        key: Option<String>,
    },
    /// Follow a job live until it is settled (nothing can change its outcome any more).
    Watch { id: String },
    /// Show a job's completion events and where each delivery stands.
    Events { id: String },
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum EndpointCommand {
    /// Register URL as where your completion events go (a signed POST per settled job); prints the secret
    /// that signs them, kept when the URL changes.
    Set {
        #[arg(value_name = "URL")]
        address: String,
    },
    /// Show your endpoint and its secret.
    Show,
    /// Remove your endpoint: events not delivered yet are dropped (idempotent).
    Remove,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum AttemptsCommand {
    /// Queue a new attempt by hand (on --provider, else the next untried provider of the chain). Sent under one
    /// key per invocation (a UUIDv7) unless --key names one, and retried with it: it queues one attempt.
    Retry {
        job: String,
        #[arg(long)]
        provider: Option<String>,
        #[arg(long)]
        key: Option<String>,
    },
    /// Resolve a live attempt out of band; failover follows (one key per invocation unless --key names one).
    Cancel {
        job: String,
        number: u32,
        #[arg(long)]
        key: Option<String>,
    },
}

/// The key a caller's write is sent under: the one named, else one of this invocation's own.
fn key_or_new(key: Option<String>) -> String {
    key.unwrap_or_else(onejob::client::new_key)
}

impl Remote {
    fn client(&self) -> Result<Client, CliError> {
        let token = self.token.as_deref().ok_or_else(|| {
            CliError::Usage(
                "no token: pass --token or set ONEJOB_TOKEN (a local server prints its dev tokens)"
                    .into(),
            )
        })?;
        let policy = Tries {
            retries: self.retries,
            timeout: Duration::from_secs(self.timeout.max(1)),
            ..Tries::default()
        };
        Ok(Client::new(&self.url, token, policy))
    }

    fn print(&self, job: &Value) {
        if self.json {
            println!("{job:#}");
        } else {
            print!("{}", render::job(job, Utc::now(), 0));
        }
    }
}

/// Runs a `jobs` command; `Ok` carries the exit status.
pub(crate) async fn jobs(command: JobsCommand, remote: &Remote) -> Result<u8, CliError> {
    let client = remote.client()?;
    match command {
        JobsCommand::Create {
            contract,
            input,
            providers,
            key,
            wait,
        } => {
            let new = JobSpec {
                contract,
                input: read_input(&input)?,
                providers,
            };
            let intent = match key {
                Some(key) => Intent::resume(key, new),
                None => Intent::new(new),
            };
            let key = intent.key();
            // Printed before the first send: if this command gives up, or is killed, the key is still known, and
            // a rerun with it cannot make a second job.
            eprintln!("key {key}");
            let created = client.submit(&intent).await?;
            let id = created.job["id"].as_str().unwrap_or_default().to_owned();
            let how = if created.replayed {
                "replayed (this key already made it)"
            } else {
                "created"
            };
            let tries = match created.tries {
                1 => String::new(),
                n => format!(" after {n} tries"),
            };
            eprintln!("{id} {how}{tries}; key {key}");
            if !wait {
                remote.print(&created.job);
                return Ok(0);
            }
            let job = if on_terminal(remote.json) {
                live(&client, created.job)
                    .await
                    .map_err(|source| CliError::Create {
                        key: key.to_owned(),
                        source,
                    })?
            } else {
                let job = client
                    .wait(&intent, &created, |job| {
                        eprintln!("{id}: {}", job["status"].as_str().unwrap_or("?"));
                    })
                    .await?;
                remote.print(&job);
                job
            };
            Ok(outcome(&job))
        }
        JobsCommand::Get { id } => {
            remote.print(&client.get_job(&id).await?);
            Ok(0)
        }
        JobsCommand::Find { key } => match client.find_job(&key).await? {
            Some(job) => {
                remote.print(&job);
                Ok(0)
            }
            None => {
                eprintln!("no job of yours has the key {key:?}");
                Ok(1)
            }
        },
        JobsCommand::List { status, limit } => {
            let page = client.list_jobs(status, limit).await?;
            if remote.json {
                println!("{page:#}");
            } else {
                print!("{}", list(&page));
            }
            Ok(0)
        }
        JobsCommand::Cancel { id, key } => {
            remote.print(&client.cancel_job(&id, &key_or_new(key)).await?);
            Ok(0)
        }
        JobsCommand::Watch { id } => Ok(watch(&client, &id, remote.json).await?),
        JobsCommand::Events { id } => {
            let list = client.job_events(&id).await?;
            if remote.json {
                println!("{list:#}");
            } else {
                print!("{}", events(&list));
            }
            Ok(0)
        }
    }
}

/// Runs `usage`: the caller's usage from `from` (default: the first of this month) to `to` (default: today).
pub(crate) async fn usage(
    from: Option<chrono::NaiveDate>,
    to: Option<chrono::NaiveDate>,
    remote: &Remote,
) -> Result<u8, CliError> {
    use chrono::Datelike;
    let today = Utc::now().date_naive();
    let to = to.unwrap_or(today);
    let from = from.unwrap_or_else(|| to.with_day(1).expect("the first of a month"));
    let usage = remote
        .client()?
        .usage(&from.to_string(), &to.to_string())
        .await?;
    if remote.json {
        println!("{usage:#}");
        return Ok(0);
    }
    let currency = usage["currency"].as_str().unwrap_or("");
    let cost = |share: &Value| format!("{:.6}", share["cost"].as_f64().unwrap_or(0.0));
    println!(
        "{:<10}  {:<16} {:>6} {:>12} {:>12} {:>14} {:>14} {:>7}",
        "day",
        "contract",
        "jobs",
        "tokens in",
        "tokens out",
        format!("cost {currency}"),
        "discarded",
        "unknown"
    );
    let rows = usage["rows"].as_array().map_or(&[][..], Vec::as_slice);
    for row in rows {
        println!(
            "{:<10}  {:<16} {:>6} {:>12} {:>12} {:>14} {:>14} {:>7}",
            row["date"].as_str().unwrap_or("?"),
            row["contract"].as_str().unwrap_or("?"),
            row["jobs"],
            row["total"]["input_tokens"],
            row["total"]["output_tokens"],
            cost(&row["total"]),
            cost(&row["discarded"]),
            row["unknown_attempts"],
        );
    }
    println!(
        "{:<10}  {:<16} {:>6} {:>12} {:>12} {:>14}",
        "total",
        "",
        "",
        usage["total"]["input_tokens"],
        usage["total"]["output_tokens"],
        cost(&usage["total"])
    );
    if let Some(day) = usage["complete_from"].as_str() {
        eprintln!(
            "more jobs than one report reads: complete from {day}; ask again with --to before it"
        );
    }
    Ok(0)
}

/// Runs an `endpoint` command.
pub(crate) async fn endpoint(command: EndpointCommand, remote: &Remote) -> Result<u8, CliError> {
    let client = remote.client()?;
    let endpoint = match command {
        EndpointCommand::Set { address } => client.put_endpoint(&address).await?,
        EndpointCommand::Show => client.endpoint().await?,
        EndpointCommand::Remove => {
            client.remove_endpoint().await?;
            eprintln!("endpoint removed");
            return Ok(0);
        }
    };
    if remote.json {
        println!("{endpoint:#}");
    } else {
        println!(
            "url     {}\nsecret  {}",
            endpoint["url"].as_str().unwrap_or("?"),
            endpoint["secret"].as_str().unwrap_or("?")
        );
    }
    Ok(0)
}

/// Runs an `attempts` command.
pub(crate) async fn attempts(command: AttemptsCommand, remote: &Remote) -> Result<u8, CliError> {
    let client = remote.client()?;
    let answer = match command {
        AttemptsCommand::Retry { job, provider, key } => {
            client
                .add_attempt(&job, provider.as_deref(), &key_or_new(key))
                .await?
        }
        AttemptsCommand::Cancel { job, number, key } => {
            client
                .cancel_attempt(&job, number, &key_or_new(key))
                .await?
        }
    };
    if remote.json || answer.get("attempts").is_none() {
        println!("{answer:#}");
    } else {
        remote.print(&answer);
    }
    Ok(0)
}

/// 0 if the job succeeded, else 1.
fn outcome(job: &Value) -> u8 {
    u8::from(job["status"] != "succeeded")
}

fn read_input(raw: &str) -> Result<Value, CliError> {
    let text = match raw.strip_prefix('@') {
        Some("-") => std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::Usage(format!("cannot read standard input: {e}")))?,
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::Usage(format!("cannot read {path}: {e}")))?,
        None => raw.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| CliError::Usage(format!("--input is not JSON: {e}")))
}

/// One line per event: its id, the status it reports, and whether it was delivered or when it is tried next.
fn events(list: &Value) -> String {
    let events = list["events"].as_array().map_or(&[][..], Vec::as_slice);
    if events.is_empty() {
        return "no events: the job has not settled since an endpoint was registered\n".to_owned();
    }
    let text = |event: &Value, field: &str| event[field].as_str().unwrap_or("?").to_owned();
    let mut out = String::new();
    for event in events {
        let tries = event["tries"].as_u64().unwrap_or(0);
        let state = if event["delivered_at"].is_string() {
            format!("delivered {} ({tries} tries)", text(event, "delivered_at"))
        } else if tries == 0 {
            "not tried yet".to_owned()
        } else {
            format!(
                "not delivered after {tries} tries: {}; next try {}",
                text(event, "last_error"),
                text(event, "next_try_at")
            )
        };
        out.push_str(&format!(
            "{}  {:<10} settled {}  {state}\n",
            text(event, "id"),
            text(event, "status"),
            text(event, "settled_at"),
        ));
    }
    out
}

fn list(page: &Value) -> String {
    let now = Utc::now();
    let mut out = format!(
        "{:<37} {:<10} {:<14} {:>8}  key\n",
        "job", "status", "contract", "age"
    );
    for job in page["jobs"].as_array().into_iter().flatten() {
        let age = job["created_at"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| (now - t.with_timezone(&Utc)).num_seconds().max(0))
            .map_or_else(|| "?".to_owned(), |s| format!("{s}s"));
        out.push_str(&format!(
            "{:<37} {:<10} {:<14} {:>8}  {}\n",
            job["id"].as_str().unwrap_or("?"),
            job["status"].as_str().unwrap_or("?"),
            job["contract"].as_str().unwrap_or("?"),
            age,
            job["idempotency_key"].as_str().unwrap_or("?"),
        ));
    }
    if let Some(cursor) = page["next_cursor"].as_str() {
        out.push_str(&format!("(more: the API's cursor is {cursor})\n"));
    }
    out
}

/// `--status`: one of the statuses a job can have, listed in `--help` and checked by clap.
fn job_status() -> impl TypedValueParser<Value = JobStatus> {
    PossibleValuesParser::new(JobStatus::ALL.map(JobStatus::as_str))
        .try_map(|raw: String| JobStatus::parse(&raw).ok_or("not a job status"))
}
