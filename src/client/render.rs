//! A job as the terminal shows it (`onejob jobs get`, `jobs watch`, `jobs create --wait`): the status, one line per
//! attempt with its provider, state and elapsed time (a spinner while it runs), the winner marked and discarded
//! results shown with whom they lost to, and the bill.

use chrono::{DateTime, Utc};
use serde_json::Value;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

const SPINNER: [&str; 4] = ["|", "/", "-", "\\"];

fn time(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let ms = (to - from).num_milliseconds().max(0);
    format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
}

/// The job at `now`; `frame` turns the spinner of a live attempt.
pub fn job(job: &Value, now: DateTime<Utc>, frame: usize) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    // The status right after the id: on a narrow terminal the line is cut from its end.
    let mut out = format!(
        "{}  {}  {}   (key {})\n",
        text(&job["id"]),
        text(&job["status"]).to_uppercase(),
        text(&job["contract"]),
        text(&job["idempotency_key"]),
    );
    let winner = job["completed_by"].as_u64();
    let attempts = job["attempts"].as_array().map_or(&[][..], Vec::as_slice);
    for attempt in attempts {
        out.push_str(&self::attempt(attempt, attempts, winner, now, frame));
        out.push('\n');
    }
    if let Some(bill) = self::bill(&job["bill"]) {
        out.push_str(&bill);
        out.push('\n');
    }
    if let Some(error) = job["error"].as_object() {
        out.push_str(&format!(
            "error: {}: {}\n",
            error.get("code").map_or_else(String::new, text),
            error.get("message").map_or_else(String::new, text)
        ));
    }
    if !job["result"].is_null() {
        out.push_str(&format!("result: {}\n", job["result"]));
    }
    out
}

/// The bill's line: the cost, what of it was thrown away, the tokens, and what is not known.
fn bill(bill: &Value) -> Option<String> {
    let total = bill.get("total")?;
    let currency = bill["currency"].as_str().unwrap_or("");
    let cost = |share: &Value| share["cost"].as_f64().unwrap_or(0.0);
    let mut line = format!(
        "bill: {:.6} {currency}, {} tokens in, {} out",
        cost(total),
        total["input_tokens"],
        total["output_tokens"]
    );
    if bill["discarded"]["attempts"].as_u64().unwrap_or(0) > 0 {
        line.push_str(&format!(
            "; {:.6} on discarded answers",
            cost(&bill["discarded"])
        ));
    }
    let listed = |key: &str| -> Vec<String> {
        bill[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("#{n}"))
            .collect()
    };
    let unknown = listed("unknown_attempts");
    if !unknown.is_empty() {
        line.push_str(&format!(
            "; {} not known yet (no answer)",
            unknown.join(", ")
        ));
    }
    let unpriced = listed("unpriced_attempts");
    if !unpriced.is_empty() {
        line.push_str(&format!("; {} without a price", unpriced.join(", ")));
    }
    Some(line)
}

fn attempt(
    attempt: &Value,
    attempts: &[Value],
    winner: Option<u64>,
    now: DateTime<Utc>,
    frame: usize,
) -> String {
    let state = attempt["state"].as_str().unwrap_or("?");
    let number = attempt["number"].as_u64().unwrap_or(0);
    let created = time(&attempt["created_at"]).unwrap_or(now);
    let started = time(&attempt["started_at"]);
    let finished = time(&attempt["finished_at"]);
    let live = matches!(state, "queued" | "started" | "unknown");
    let elapsed = seconds(started.unwrap_or(created), finished.unwrap_or(now));
    let mark = if live {
        SPINNER[frame % SPINNER.len()]
    } else {
        " "
    };
    let note = match state {
        "succeeded" if winner == Some(number) => "* winner".to_owned(),
        "discarded" => match winner {
            Some(w) => format!("result discarded: lost to attempt {w}"),
            None => "result discarded: the job was cancelled".to_owned(),
        },
        "unknown" => "no answer in time; may still be working (cancel it to move on)".to_owned(),
        "queued" => match (attempt["retry_of"].as_u64(), time(&attempt["not_before"])) {
            (Some(of), Some(at)) => {
                let cause = attempts
                    .iter()
                    .find(|a| a["number"].as_u64() == Some(of))
                    .and_then(|a| a["error"]["code"].as_str())
                    .unwrap_or("a refusal");
                format!(
                    "retry of #{of} after {cause}, not before {}",
                    at.format("%H:%M:%S")
                )
            }
            _ => "waiting for a worker".to_owned(),
        },
        _ => match attempt["error"].as_object() {
            Some(e) => format!(
                "{}: {}",
                e.get("code").and_then(Value::as_str).unwrap_or("?"),
                e.get("message").and_then(Value::as_str).unwrap_or("")
            ),
            None => String::new(),
        },
    };
    format!(
        "{mark} #{number} {:<16} {:<10} {:>7}  {note}",
        attempt["provider"].as_str().unwrap_or("?"),
        state,
        elapsed
    )
    .trim_end()
    .to_owned()
}

/// `view` made to fit a terminal of `cols` × `rows`, so that every line takes exactly one row and the whole takes
/// fewer rows than the screen has (a drawing redrawn in place can only move up as far as the screen's top): a line
/// wider than `cols - 1` columns is cut and ends with `…`; lines beyond `rows - 1` are left out and counted.
pub fn fit(view: &str, cols: u16, rows: u16) -> String {
    let width = usize::from(cols.saturating_sub(1).max(2));
    let height = usize::from(rows.saturating_sub(1).max(2));
    let lines: Vec<&str> = view.lines().collect();
    let shown = if lines.len() > height {
        height - 1
    } else {
        lines.len()
    };
    let mut out = String::new();
    for line in &lines[..shown] {
        out.push_str(&cut(line, width));
        out.push('\n');
    }
    if shown < lines.len() {
        let more = format!("… {} more lines", lines.len() - shown);
        out.push_str(&cut(&more, width));
        out.push('\n');
    }
    out
}

/// `line` in at most `width` columns (wide characters count two).
fn cut(line: &str, width: usize) -> String {
    if line.width() <= width {
        return line.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in line.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > width - 1 {
            break;
        }
        used += w;
        out.push(c);
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_job_shows_each_attempt_the_winner_and_the_loser() {
        let now = time(&json!("2026-11-30T09:00:10.000Z")).unwrap();
        let job = json!({
            "id": "job_1", "contract": "summarize@1", "status": "succeeded", "idempotency_key": "k",
            "completed_by": 2, "result": {"summary": "B"}, "error": null,
            "attempts": [
                {"number": 1, "provider": "slow", "state": "discarded", "created_at": "2026-11-30T09:00:00.000Z",
                 "started_at": "2026-11-30T09:00:00.100Z", "finished_at": "2026-11-30T09:00:09.100Z"},
                {"number": 2, "provider": "backup", "state": "succeeded", "created_at": "2026-11-30T09:00:04.000Z",
                 "started_at": "2026-11-30T09:00:04.000Z", "finished_at": "2026-11-30T09:00:04.500Z"},
            ],
        });
        let shown = super::job(&job, now, 0);
        assert_eq!(
            shown,
            "job_1  SUCCEEDED  summarize@1   (key k)\n\
             \u{20} #1 slow             discarded     9.0s  result discarded: lost to attempt 2\n\
             \u{20} #2 backup           succeeded     0.5s  * winner\n\
             result: {\"summary\":\"B\"}\n"
        );
    }

    #[test]
    fn a_live_attempt_spins_and_counts_from_its_start() {
        let now = time(&json!("2026-11-30T09:00:03.300Z")).unwrap();
        let job = json!({
            "id": "job_1", "contract": "summarize@1", "status": "unknown", "idempotency_key": "k",
            "completed_by": null, "result": null, "error": null,
            "attempts": [{"number": 1, "provider": "slow", "state": "unknown",
                          "created_at": "2026-11-30T09:00:00.000Z", "started_at": "2026-11-30T09:00:00.100Z"}],
        });
        let first = super::job(&job, now, 0);
        let second = super::job(&job, now, 1);
        assert!(
            first.contains("| #1 slow             unknown       3.2s  no answer in time"),
            "{first}"
        );
        assert!(second.contains("/ #1 slow"), "{second}");
    }

    #[test]
    fn a_view_fits_the_terminal_one_row_per_line() {
        let view = format!("header\n{}\nshort\n", "x".repeat(100));
        let fitted = fit(&view, 80, 24);
        let lines: Vec<&str> = fitted.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "header");
        assert_eq!(lines[1], format!("{}…", "x".repeat(78)));
        assert_eq!(lines[1].width(), 79);
        assert_eq!(lines[2], "short");
        // Wide characters count two columns; the cut never splits one past the edge.
        let wide = fit(&"日本".repeat(30), 20, 24);
        assert!(wide.trim_end().width() <= 19, "{wide}");
        assert!(wide.trim_end().ends_with('…'));
    }

    #[test]
    fn a_view_taller_than_the_terminal_keeps_its_top_and_counts_the_rest() {
        let view: String = (0..30).map(|n| format!("line {n}\n")).collect();
        let fitted = fit(&view, 80, 10);
        let lines: Vec<&str> = fitted.lines().collect();
        assert_eq!(lines.len(), 9, "fewer rows than the screen: {fitted}");
        assert_eq!(lines[0], "line 0");
        assert_eq!(lines[7], "line 7");
        assert_eq!(lines[8], "… 22 more lines");
    }

    #[test]
    fn a_retry_says_what_it_retries_and_when_it_may_start() {
        let now = time(&json!("2026-11-30T09:00:01.000Z")).unwrap();
        let job = json!({
            "id": "job_1", "contract": "summarize@1", "status": "queued", "idempotency_key": "k",
            "completed_by": null, "result": null, "error": null,
            "attempts": [
                {"number": 1, "provider": "openai", "state": "failed", "created_at": "2026-11-30T09:00:00.000Z",
                 "started_at": "2026-11-30T09:00:00.000Z", "finished_at": "2026-11-30T09:00:00.500Z",
                 "error": {"code": "rate_limited", "message": "HTTP 429"}},
                {"number": 2, "provider": "openai", "state": "queued", "created_at": "2026-11-30T09:00:00.500Z",
                 "retry_of": 1, "not_before": "2026-11-30T09:00:12.500Z"},
            ],
        });
        let shown = super::job(&job, now, 0);
        assert!(
            shown.contains("#2 openai           queued        0.5s  retry of #1 after rate_limited, not before 09:00:12"),
            "{shown}"
        );
    }
}
