//! The command line in a terminal: the live view at 80 and 60 columns (tmux), completions and manual pages for every
//! command.

use super::*;

/// `onejob jobs watch` in a real terminal 80 columns wide, on a job whose `unknown` attempt's line (with its
/// advice) is wider than that: every screen shows the job's header at most once — exactly once from the first
/// frame on — while the view redraws itself, after the window shrinks to 60 columns, and when the job ends (the
/// provider, held until then, answers late and wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_holds_in_a_terminal_narrower_than_its_lines() {
    let gate = Gate::new();
    let provider = StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Status(500, "")).await;
    // `unknown` after its 1 s timeout; a late answer still counts for a minute.
    let slow = stand_in::openai(provider.base_url()).with_timings(stand_in::TIMEOUT_MS, 60_000);
    let app = App::with(vec![("slow", slow)]).await;
    let client = Client::new(&app.url(), "dev-token-alice", Tries::default());
    let intent = Intent::new(JobSpec {
        providers: Some(vec!["slow".into()]),
        ..crate::library::summarize_intent().job().clone()
    });
    let created = client.submit(&intent).await.unwrap();
    let id = created.job["id"].as_str().unwrap().to_owned();
    let tmux = Tmux {
        socket: format!("onejob-test-{}", std::process::id()),
        started: Instant::now(),
    };
    // After the view, its exit status, and the pane stays open (waiting for a line) so its screen can be read.
    let command = format!(
        "ONEJOB_TOKEN=dev-token-alice {} jobs watch {id} --url {}; echo \"exit $?\"; read line",
        env!("CARGO_BIN_EXE_onejob"),
        app.url()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-x",
        "80",
        "-y",
        "24",
        "-s",
        "watch",
        &command,
    ]);
    let headers = |screen: &str| screen.lines().filter(|l| l.starts_with(&id)).count();
    let spinner = |screen: &str| {
        screen
            .lines()
            .find(|l| l.contains(" #1 slow"))
            .and_then(|l| l.chars().next())
    };

    // Frames go by while the attempt is `unknown`: the spinner turns at least three times.
    let mut turns = std::collections::BTreeSet::new();
    let mut drawn = false;
    while turns.len() < 3 {
        let screen = tmux.screen();
        drawn |= headers(&screen) == 1;
        let limit = usize::from(drawn);
        assert!(
            headers(&screen) <= 1 && headers(&screen) >= limit,
            "{screen}"
        );
        assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
        if screen.contains("unknown") {
            assert!(screen.contains('…'), "the wide line is cut: {screen}");
            turns.extend(spinner(&screen));
        }
        tmux.next_look().await;
    }

    // A narrower window: the view follows it.
    tmux.run(&["resize-window", "-t", "watch", "-x", "60"]);
    let mut narrow = 0;
    while narrow < 3 {
        let screen = tmux.screen();
        assert!(headers(&screen) <= 1, "{screen}");
        if screen.lines().all(|l| l.chars().count() < 60) && headers(&screen) == 1 {
            narrow += 1;
        }
        tmux.next_look().await;
    }

    // The late answer wins; the job ends and the view with it: its last frame.
    gate.open(serde_json::json!({"summary": "The projector broke."}));
    let screen = loop {
        let screen = tmux.screen();
        assert!(headers(&screen) <= 1, "{screen}");
        if screen.contains("exit ") {
            break screen;
        }
        tmux.next_look().await;
    };
    assert_eq!(headers(&screen), 1, "{screen}");
    assert!(screen.contains("SUCCEEDED"), "{screen}");
    assert!(screen.contains("* winner"), "{screen}");
    assert!(screen.contains("exit 0"), "the job succeeded: {screen}");
}

/// `onejob completions SHELL` and `onejob man DIR` come from the same clap definition as the commands: the
/// scripts complete the subcommands and their flags, and every subcommand has its page.
#[test]
fn completions_and_manual_pages_cover_every_command() {
    let onejob = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(args)
            .output()
            .unwrap()
    };
    let bash = onejob(&["completions", "bash"]);
    assert!(bash.status.success());
    let bash = String::from_utf8(bash.stdout).unwrap();
    for word in ["watch", "attempts", "--contract", "--wait", "--key"] {
        assert!(bash.contains(word), "bash completes {word}");
    }
    let zsh = String::from_utf8(onejob(&["completions", "zsh"]).stdout).unwrap();
    assert!(zsh.starts_with("#compdef onejob"), "{zsh}");
    assert_eq!(onejob(&["completions", "tcsh"]).status.code(), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let man = onejob(&["man", dir.path().to_str().unwrap()]);
    assert!(
        man.status.success(),
        "{}",
        String::from_utf8_lossy(&man.stderr)
    );
    for page in [
        "onejob.1",
        "onejob-serve.1",
        "onejob-jobs-watch.1",
        "onejob-attempts-retry.1",
    ] {
        assert!(dir.path().join(page).exists(), "{page}");
    }
    let create = std::fs::read_to_string(dir.path().join("onejob-jobs-create.1")).unwrap();
    assert!(create.starts_with(".ie"), "roff");
    assert!(create.contains(r"\-\-contract"), "{create}");
    assert!(create.contains("idempotency key"), "{create}");
}
