use super::*;

/// Every statement that finds a job by its id (they all say [`id_is`]) goes through `jobs_by_id` — whose
/// order puts a new job at its end — and never scans the table, whatever the id looks like.
#[test]
fn a_job_is_found_by_its_id_through_the_index_ordered_by_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.db");
    drop(super::super::SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    for id in [
        "job_d8725b8ac4080afd1bb3a5fa6cf2ea9d_mywpiww0",
        "job_00000000000000000000000000000001",
    ] {
        let plan: Vec<String> = conn
            .prepare(&format!(
                "EXPLAIN QUERY PLAN SELECT seq FROM jobs WHERE {}",
                id_is("?1")
            ))
            .unwrap()
            .query_map([id], |row| row.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(plan.len(), 1, "{plan:?}");
        assert!(
            plan[0].starts_with("SEARCH jobs USING COVERING INDEX jobs_by_id"),
            "{plan:?}"
        );
    }
}
