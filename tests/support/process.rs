//! `onejob serve` as a process, the way an operator runs it.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts `onejob serve --addr 127.0.0.1:0 ARGS…` in `dir` (without tokens: the dev tokens, on loopback) and waits
/// until it listens: the process and its base URL; or, if it exits first, what it wrote to standard error.
pub(crate) async fn serve(dir: &Path, args: &[&OsStr]) -> Result<(Child, String), String> {
    serve_with(dir, args, &[]).await
}

/// [`serve`], with these environment variables too.
pub(crate) async fn serve_with(
    dir: &Path,
    args: &[&OsStr],
    env: &[(&str, &str)],
) -> Result<(Child, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "error")
        .env_remove("ONEJOB_TOKENS")
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DB")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(addr) =
            line.strip_prefix("No tokens configured: accepting these dev tokens on ")
        {
            let url = format!("http://{}", addr.trim_end_matches(':'));
            // Keep reading what it prints, so that it never writes into a closed or a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            let mut errors = child.stderr.take().unwrap();
            tokio::spawn(async move { tokio::io::copy(&mut errors, &mut tokio::io::sink()).await });
            return Ok((child, url));
        }
    }
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    Err(stderr)
}
