//! Following a job: `jobs watch`, and `jobs create --wait` on a terminal, redrawn in place there.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::Utc;
use crossterm::terminal::{self, Clear, ClearType};
use crossterm::{cursor, queue};
use serde_json::Value;

use onejob::client::{Client, ClientError, Poll, is_settled, render};

use super::outcome;

/// Follows the job until it is settled. On a terminal the view is redrawn in place (see [`live`]); otherwise each
/// new version is printed once, as a block (or a JSON line with `--json`).
pub(super) async fn watch(client: &Client, id: &str, json: bool) -> Result<u8, ClientError> {
    let job = if on_terminal(json) {
        live(client, client.get_job(id).await?).await?
    } else {
        let print = |job: &Value| {
            if json {
                println!("{job}");
            } else {
                println!("{}", render::job(job, Utc::now(), 0));
            }
        };
        client.follow(id, None, print).await?
    };
    Ok(outcome(&job))
}

/// Whether the live view is drawn: on a terminal, unless JSON was asked for.
pub(super) fn on_terminal(json: bool) -> bool {
    std::io::stdout().is_terminal() && !json
}

/// The live view: `job` redrawn in place four times a second (a spinner and running clocks for live attempts) and
/// on every change, until it is settled; returns the settled job.
pub(super) async fn live(client: &Client, mut job: Value) -> Result<Value, ClientError> {
    let id = job["id"].as_str().unwrap_or_default().to_owned();
    let mut etag: Option<String> = None;
    let mut screen = Screen::default();
    let mut ticks = tokio::time::interval(Duration::from_millis(250));
    let mut pending = None;
    let mut frame = 0;
    loop {
        screen.draw(&render::job(&job, Utc::now(), frame));
        if is_settled(&job) {
            return Ok(job);
        }
        let poll = pending.get_or_insert_with(|| Box::pin(client.poll(&id, etag.clone(), 20)));
        tokio::select! {
            answer = poll => {
                pending = None;
                if let Poll::Changed { job: new, etag: new_etag } = answer? {
                    job = new;
                    etag = new_etag;
                }
            }
            _ = ticks.tick() => frame += 1,
        }
    }
}

/// A drawing redrawn in place on a terminal. Each frame is cut to the terminal's size as it is now (every line one
/// row, the whole shorter than the screen), so going back up by the lines drawn lands on the drawing's first row;
/// after a resize, which may have re-wrapped what the screen shows, the frame is drawn on a cleared screen.
#[derive(Debug, Default)]
struct Screen {
    lines: u16,
    size: Option<(u16, u16)>,
}

impl Screen {
    fn draw(&mut self, view: &str) {
        let size = terminal::size().unwrap_or((80, 24));
        let fitted = render::fit(view, size.0, size.1);
        let mut stdout = std::io::stdout().lock();
        // A terminal that cannot be written to has nobody to show the view to: the follow goes on regardless.
        let _ = self.redraw(&mut stdout, &fitted, size);
        self.lines = u16::try_from(fitted.lines().count()).unwrap_or(u16::MAX);
        self.size = Some(size);
    }

    /// Back to the drawing's first row, then each row overwritten and what is left of the old one erased (no
    /// screen-wide clear: no flicker, and nothing of the drawing pushed into the terminal's scrollback).
    fn redraw(&self, out: &mut impl Write, fitted: &str, size: (u16, u16)) -> std::io::Result<()> {
        if self.size.is_some_and(|drawn| drawn != size) {
            queue!(out, cursor::MoveTo(0, 0), Clear(ClearType::All))?;
        } else if self.lines > 0 {
            queue!(out, cursor::MoveUp(self.lines), cursor::MoveToColumn(0))?;
        }
        for line in fitted.lines() {
            out.write_all(line.as_bytes())?;
            queue!(out, Clear(ClearType::UntilNewLine))?;
            out.write_all(b"\n")?;
        }
        queue!(out, Clear(ClearType::FromCursorDown))?;
        out.flush()
    }
}
