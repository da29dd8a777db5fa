//! The one writer: a thread that owns the write connection and commits many writes in one transaction (group
//! commit). Each write runs in its own savepoint, so it applies whole or not at all whatever its neighbours do, and
//! its caller is answered only after the commit that holds it: nothing is acknowledged before it is durable as
//! the file's settings make it (WAL, `synchronous=NORMAL`).
//!
//! While one transaction commits, the writes that arrive queue up and go into the next one, so a busy store pays
//! one commit for many writes and an idle one still commits each write at once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::SqliteError;
use crate::store::StoreError;

/// The most writes one transaction commits.
const BATCH: usize = 256;

/// Answers a write's caller once its transaction ended: `Ok` if it committed, else why not.
type Answer = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One write: run in the batch's transaction (`None` if none could begin), it says whether it succeeded (so its
/// savepoint is kept or rolled back) and how to answer its caller.
type Work = Box<dyn FnOnce(Option<&Transaction<'_>>) -> (bool, Answer) + Send>;

#[derive(Debug)]
pub(super) struct Writer {
    queue: mpsc::Sender<Work>,
}

impl Writer {
    /// Starts the writer thread on `conn`; it ends when the last handle is dropped.
    pub(super) fn start(conn: Connection) -> Result<Self, StoreError> {
        let (queue, works) = mpsc::channel::<Work>();
        std::thread::Builder::new()
            .name("onejob-sqlite-writer".into())
            .spawn(move || run(conn, works))
            .map_err(StoreError::backend)?;
        Ok(Self { queue })
    }

    /// Runs `f` in the next transaction, in a savepoint of its own; answers once that transaction committed.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let work: Work = Box::new(move |tx| {
            let out = match tx {
                Some(tx) => f(tx),
                None => Err(SqliteError::Commit("no transaction could begin".into()).into()),
            };
            let ok = out.is_ok();
            let reply: Answer = Box::new(move |committed| {
                let result = committed
                    .map_err(|e| StoreError::from(SqliteError::Commit(e)))
                    .and(out);
                // A caller that stopped waiting is no longer there to answer.
                let _ = answer.send(result);
            });
            (ok, reply)
        });
        self.queue
            .send(work)
            .map_err(|_| StoreError::from(SqliteError::WriterGone))?;
        // A write that panicked drops its answer: its savepoint was rolled back.
        answered
            .await
            .map_err(|_| StoreError::from(SqliteError::WriterGone))?
    }
}

/// The writer thread: takes the writes waiting (at least one, at most [`BATCH`]), runs them in one transaction
/// and answers them after it ends.
fn run(mut conn: Connection, works: mpsc::Receiver<Work>) {
    while let Ok(first) = works.recv() {
        let mut batch = vec![first];
        batch.extend(works.try_iter().take(BATCH - 1));
        let (answers, ended) = commit(&mut conn, batch);
        for answer in answers {
            answer(ended.clone());
        }
    }
}

/// Runs `batch` in one `BEGIN IMMEDIATE` transaction, each write in a savepoint; how it ended.
fn commit(conn: &mut Connection, batch: Vec<Work>) -> (Vec<Answer>, Result<(), String>) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let answers = batch.into_iter().map(|work| work(None).1).collect();
            return (answers, Err(e.to_string()));
        }
    };
    let mut answers = Vec::with_capacity(batch.len());
    let mut broken = None;
    for work in batch {
        if let Err(e) = run_cached(&tx, "SAVEPOINT write") {
            broken.get_or_insert(e.to_string());
        }
        let ran = catch_unwind(AssertUnwindSafe(|| work(Some(&tx))));
        let keep = matches!(ran, Ok((true, _)));
        let closed = if keep {
            run_cached(&tx, "RELEASE write")
        } else {
            run_cached(&tx, "ROLLBACK TO write").and_then(|()| run_cached(&tx, "RELEASE write"))
        };
        if let Err(e) = closed {
            broken.get_or_insert(e.to_string());
        }
        if let Ok((_, answer)) = ran {
            answers.push(answer);
        }
    }
    let ended = match broken {
        // A savepoint that could not be closed leaves the transaction in doubt: none of it is kept.
        Some(e) => Err(e),
        None => tx.commit().map_err(|e| e.to_string()),
    };
    (answers, ended)
}

/// Runs a statement prepared once per connection (a savepoint's, each write pays three).
fn run_cached(tx: &Transaction<'_>, sql: &str) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?.execute([]).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn writer() -> (tempfile::TempDir, Arc<Writer>) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("w.db")).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (n INTEGER PRIMARY KEY)")
            .unwrap();
        (dir, Arc::new(Writer::start(conn).unwrap()))
    }

    fn insert(tx: &Transaction<'_>, n: i64) -> Result<(), StoreError> {
        tx.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
        Ok(())
    }

    /// The bundled SQLite is built without memory statistics (`.cargo/config.toml`): with them, every allocation
    /// of every connection takes one process-wide mutex, which the writer thread and the readers then queue on.
    #[test]
    fn sqlite_is_built_without_its_process_wide_allocation_mutex() {
        let conn = Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    /// Writes that share a transaction stay apart: each applies whole or not at all, a failing or panicking one
    /// takes nothing of its own and nothing of its neighbours', and every caller hears its own answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_sharing_a_transaction_apply_whole_or_not_at_all() {
        let (_dir, writer) = writer();
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..300i64 {
            let writer = writer.clone();
            calls.spawn(async move {
                let answer = writer
                    .write(move |tx| {
                        insert(tx, n)?;
                        insert(tx, 1_000 + n)?;
                        match n % 3 {
                            0 => Ok(n),
                            1 => Err(StoreError::NotFound),
                            _ if n % 30 == 2 => panic!("a write that panics"),
                            // Its own row again: the key is taken, a constraint error.
                            _ => insert(tx, n).map(|()| n),
                        }
                    })
                    .await;
                (n, answer)
            });
        }
        let mut kept = Vec::new();
        while let Some(done) = calls.join_next().await {
            let (n, answer) = done.unwrap();
            match n % 3 {
                0 => {
                    assert_eq!(answer.unwrap(), n);
                    kept.push(n);
                }
                _ => assert!(answer.is_err(), "write {n} answered {answer:?}"),
            }
        }
        kept.sort_unstable();
        let stored: Vec<i64> = writer
            .write(|tx| {
                let mut rows = tx.prepare("SELECT n FROM t WHERE n < 1000 ORDER BY n")?;
                let found = rows
                    .query_map([], |row| row.get(0))?
                    .collect::<Result<Vec<i64>, _>>()?;
                Ok(found)
            })
            .await
            .unwrap();
        assert_eq!(stored, kept);
        let pairs: i64 = writer
            .write(|tx| {
                Ok(tx.query_row("SELECT COUNT(*) FROM t WHERE n >= 1000", [], |r| r.get(0))?)
            })
            .await
            .unwrap();
        assert_eq!(
            pairs as usize,
            kept.len(),
            "each write's second row goes with its first"
        );
    }
}
