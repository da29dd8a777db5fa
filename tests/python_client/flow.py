"""The whole flow through a Python client that openapi-python-client generated from /openapi.json, used as it
comes: create, replay (seen as a replay), conflict (409 parsed), a long poll with the ETag, an attempt added with no
body, the listing, a cancel. Run by scripts/python-client with the generated package `onejob_client` on the path.

    python flow.py BASE_URL TOKEN
"""

import sys
import uuid
from http import HTTPStatus

from onejob_client import AuthenticatedClient
from onejob_client.api.attempts import add_attempt
from onejob_client.api.jobs import cancel_job, create_job, get_job, list_jobs
from onejob_client.models import CreateJobRequest, JobStatus, JobView, Problem
from onejob_client.types import UNSET


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what)


def request(text, providers=None):
    body = {"contract": "summarize@1", "input": {"text": text}}
    if providers is not None:
        body["providers"] = providers
    return CreateJobRequest.from_dict(body)


def settle(client, job_id):
    """Long-polls with the ETag until the job is settled; returns the job and how many polls said 304."""
    first = get_job.sync_detailed(job_id, client=client)
    check(first.status_code == HTTPStatus.OK and isinstance(first.parsed, JobView), "get answers the job")
    job, etag, unchanged = first.parsed, first.headers.get("etag"), 0
    check(etag is not None, "a job answer carries its ETag")
    while not job.settled:
        answer = get_job.sync_detailed(job_id, client=client, wait=5, if_none_match=etag)
        if answer.status_code == HTTPStatus.NOT_MODIFIED:
            check(answer.headers.get("etag") == etag, "a 304 names the version the client has")
            unchanged += 1
            continue
        check(answer.status_code == HTTPStatus.OK, f"a long poll answers 200 or 304: {answer.status_code}")
        job, etag = answer.parsed, answer.headers["etag"]
    return job, unchanged


def main(base_url, token):
    client = AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True)
    key = str(uuid.uuid4())
    body = request("The projector broke. The meeting moved.")

    created = create_job.sync_detailed(client=client, body=body, idempotency_key=key)
    check(created.status_code == HTTPStatus.CREATED, "a new key creates (201)")
    job = created.parsed
    check(isinstance(job, JobView) and job.idempotency_key == key, "the created job is parsed")
    check(created.headers["location"] == f"/v1/jobs/{job.id}", "Location names the job")
    check("idempotent-replayed" not in created.headers, "a create is not a replay")

    replay = create_job.sync_detailed(client=client, body=body, idempotency_key=key)
    check(replay.status_code == HTTPStatus.OK, "the same intent again is a replay (200)")
    check(replay.headers["idempotent-replayed"] == "true", "Idempotent-Replayed: true")
    check(replay.parsed.id == job.id, "the replay answers with the same job")

    conflict = create_job.sync_detailed(client=client, body=request("Another text."), idempotency_key=key)
    check(conflict.status_code == HTTPStatus.CONFLICT, "the key with another intent is a conflict (409)")
    check(isinstance(conflict.parsed, Problem), "the problem is parsed")
    check(conflict.parsed.code == "idempotency_key_reused", "its code is idempotency_key_reused")
    check(conflict.parsed.job_id == job.id, "it names the existing job")

    done, _ = settle(client, job.id)
    check(done.status == JobStatus.SUCCEEDED and done.completed_by == 1, "the job succeeded on attempt 1")

    # A job whose only provider fails, then an attempt added by hand, with no body at all.
    failing = create_job.sync(client=client, body=request("Fails.", ["demo-fail"]), idempotency_key=str(uuid.uuid4()))
    failed, _ = settle(client, failing.id)
    check(failed.status == JobStatus.FAILED, "a job on a failing provider fails")
    added = add_attempt.sync_detailed(failing.id, client=client)
    check(added.status_code == HTTPStatus.CREATED, f"an attempt is added with no body (201): {added.content!r}")
    check(added.parsed.number == 2 and added.parsed.provider == "demo-fail", "on the job's primary, as attempt 2")
    refailed, _ = settle(client, failing.id)
    check(len(refailed.attempts) == 2, "the job shows both attempts")

    listing = list_jobs.sync(client=client, limit=10)
    ids = [j.id for j in listing.jobs]
    check(job.id in ids and failing.id in ids, "the listing shows both jobs")
    only_failed = list_jobs.sync(client=client, status=JobStatus.FAILED)
    check([j.id for j in only_failed.jobs] == [failing.id], "the listing filters by status")

    cancelled = cancel_job.sync_detailed(failing.id, client=client)
    check(cancelled.status_code == HTTPStatus.OK, "a failed job can be cancelled (200)")
    check(cancelled.parsed.status == JobStatus.CANCELLED, "it is cancelled")
    again = cancel_job.sync_detailed(failing.id, client=client)
    check(again.status_code == HTTPStatus.OK, "cancelling again is idempotent (200)")
    finished = cancel_job.sync_detailed(job.id, client=client)
    check(finished.status_code == HTTPStatus.CONFLICT and finished.parsed.code == "job_finished",
          "a succeeded job cannot be cancelled (409 job_finished)")

    missing = get_job.sync_detailed("job_nope", client=client, if_none_match=UNSET)
    check(missing.status_code == HTTPStatus.NOT_FOUND and missing.parsed.code == "job_not_found", "404 parsed")
    print("python client flow: all steps passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
