//! The sessions and GPU-hours limits against [`Sharing`] itself: concurrent creates,
//! metering, the refusal's text, and a restart.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::quota::{Limit, Limits, Refusal};
use super::usage::HOUR_MS;
use super::{GIB, Sharing};
use crate::base::{UnixMs, unix_ms};
use crate::graph::NodeId;
use crate::instances::InstanceView;
use crate::store::Db;

const HALF_LIFE: Duration = Duration::from_secs(7 * 24 * 3600);

fn limits(set: impl FnOnce(&mut Limits)) -> Limits {
    let mut limits = Limits::default();
    set(&mut limits);
    limits
}

#[tokio::test]
async fn no_interleaving_of_session_creates_passes_a_user_or_group_limit() {
    let dir = tempfile::tempdir().unwrap();
    let sharing = Sharing::open(&Db::open(dir.path()).unwrap(), HALF_LIFE).unwrap();
    sharing
        .set_group("nlp", None, &limits(|l| l.sessions = Some(5)), &[])
        .await
        .unwrap();
    for user in ["ada", "bo"] {
        sharing
            .set_user(user, Some("nlp"), None, &limits(|l| l.sessions = Some(3)), &[])
            .await
            .unwrap();
    }
    // Bo has 1 already (counted from the store at the start).
    sharing.load_sessions(HashMap::from([("bo".to_owned(), 1)]));
    // 16 threads each try to make a session for ada and one for bo, all at once.
    let start = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let sharing = sharing.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                let user = if i % 2 == 0 { "ada" } else { "bo" };
                (user, sharing.reserve_session(user))
            })
        })
        .collect();
    let outcomes: Vec<(&str, Result<(), Refusal>)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let made = |user: &str| outcomes.iter().filter(|(u, r)| *u == user && r.is_ok()).count();
    // The group's 5 in all: bo's 1 and 4 new, and neither user past their own 3.
    assert_eq!(made("ada") + made("bo"), 4, "{outcomes:?}");
    assert!(made("ada") <= 3 && made("bo") <= 2, "{outcomes:?}");
    let refusal = outcomes.iter().find_map(|(_, r)| r.clone().err()).unwrap();
    assert_eq!(refusal.limit, Limit::Sessions);
    let text = refusal.to_string();
    assert!(
        text.contains("it frees when one of those sessions is deleted (`DELETE /v1/sessions/{id}`; `GET /v1/sessions` lists them); help: an admin can raise it with `skein quota set --"),
        "{text}"
    );
    let held = sharing.holding(None, "nlp", &[]);
    assert_eq!(held.sessions, 5);
    // A delete frees a place for the group.
    let someone = if made("ada") > 0 { "ada" } else { "bo" };
    sharing.release_session(someone);
    assert!(sharing.reserve_session(someone).is_ok());
    assert!(sharing.reserve_session(someone).is_err());
}

/// An instance of `run` holding `gpus` GPUs of 10 GiB each on node `n1`.
fn instance(run: &str, gpus: u32) -> InstanceView {
    let mut view = crate::instances::new_view("i1", &NodeId("n1".to_owned()), "n1");
    view.run = Some(run.to_owned());
    view.variant = "Qwen/Qwen2.5-7B-Instruct".to_owned();
    view.agents = vec!["writer".to_owned()];
    view.held = (0..gpus).map(|gpu| (gpu, 10 * GIB as u64)).collect();
    view
}

#[tokio::test]
async fn gpu_hours_of_the_period_queue_runs_until_enough_ages_out_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path()).unwrap();
    let sharing = Sharing::open(&db, HALF_LIFE).unwrap();
    sharing
        .set_group(
            "vision",
            None,
            &limits(|l| {
                l.gpu_hours = Some(5.0);
                l.gpu_hours_period_hours = Some(24);
            }),
            &[],
        )
        .await
        .unwrap();
    sharing
        .set_user("ada", Some("vision"), None, &Limits::default(), &[])
        .await
        .unwrap();
    sharing.reserve_run("ada", "r1").unwrap();
    // Two GPUs for three hours, metered every half hour: 6 GPU-hours, an hour ago.
    let hour = unix_ms().0.div_euclid(HOUR_MS) - 4;
    let held = [instance("r1", 2)];
    for step in 0..=6 {
        sharing
            .meter(UnixMs(hour * HOUR_MS + step * HOUR_MS / 2), &held)
            .await
            .unwrap();
    }
    sharing.write_usage().await.unwrap();
    let vision = sharing.holding(None, "vision", &[]);
    assert!((vision.gpu_hours - 6.0).abs() < 1e-9, "{vision:?}");
    // A second run of the group waits: the period's 6 GPU-hours passed its 5.
    sharing.reserve_run("ada", "r2").unwrap();
    let refusal = sharing.check_gpus("r2", &Default::default(), &[]).unwrap_err();
    assert_eq!(refusal.limit, Limit::GpuHours);
    let text = refusal.to_string();
    assert!(
        text.starts_with("group `vision` may use 5.0 GPU-hours over their period: 6.0 GPU-hours in use; the period is the last day, and enough of it ages out in "),
        "{text}"
    );
    assert!(
        text.ends_with("; the run waits until then; help: an admin can raise it with `skein quota set --group vision --gpu-hours N`"),
        "{text}"
    );
    // Enough ages out once the first metered hour leaves the day: about 21 hours on.
    let after = refusal.retry_after.unwrap();
    assert!(
        after > Duration::from_secs(19 * 3600) && after <= Duration::from_secs(21 * 3600),
        "{after:?}"
    );
    // Ada's own use counts the same hours; she has no limit of her own.
    assert!((sharing.holding(Some("ada"), "vision", &[]).gpu_hours - 6.0).abs() < 1e-9);
    // A restart reads the period back from the usage records.
    drop(sharing);
    let reopened = Sharing::open(&db, HALF_LIFE).unwrap();
    reopened.resume_run("ada", "r2");
    let again = reopened.check_gpus("r2", &Default::default(), &[]).unwrap_err();
    assert_eq!(again.limit, Limit::GpuHours);
    assert!((again.in_use - 6.0).abs() < 1e-9, "{again:?}");
    // A longer limit lets it in; lifting the limit too.
    reopened
        .set_group("vision", None, &limits(|l| l.gpu_hours = Some(8.0)), &[])
        .await
        .unwrap();
    assert!(reopened.check_gpus("r2", &Default::default(), &[]).is_ok());
    let cleared = reopened
        .set_group("vision", None, &Limits::default(), &[Limit::GpuHours])
        .await
        .unwrap();
    assert_eq!(cleared.limits, Limits::default());
}

#[tokio::test]
async fn a_period_needs_its_limit_and_stays_within_31_days() {
    let dir = tempfile::tempdir().unwrap();
    let sharing = Sharing::open(&Db::open(dir.path()).unwrap(), HALF_LIFE).unwrap();
    let error = sharing
        .set_group("a", None, &limits(|l| l.gpu_hours_period_hours = Some(24)), &[])
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "group `a`: `gpu_hours_period_hours` is the period of a `gpu_hours` limit: set `gpu_hours` too"
    );
    let error = sharing
        .set_group(
            "a",
            None,
            &limits(|l| {
                l.gpu_hours = Some(1.0);
                l.gpu_hours_period_hours = Some(745);
            }),
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("must be 1 to 744 (31 days), not 745"),
        "{error}"
    );
    let error = sharing
        .set_user("ada", None, None, &limits(|l| l.sessions = Some(0)), &[])
        .await
        .unwrap_err();
    assert!(error.to_string().contains("`sessions` must be at least 1"), "{error}");
}

#[tokio::test]
async fn a_user_who_moves_takes_their_sessions_to_the_new_group() {
    let dir = tempfile::tempdir().unwrap();
    let sharing = Sharing::open(&Db::open(dir.path()).unwrap(), HALF_LIFE).unwrap();
    for group in ["nlp", "vision"] {
        sharing
            .set_group(group, None, &limits(|l| l.sessions = Some(3)), &[])
            .await
            .unwrap();
    }
    // Ada's two sessions, counted at the start while she was in no group.
    sharing.load_sessions(HashMap::from([("ada".to_owned(), 2)]));
    assert_eq!(sharing.holding(None, super::DEFAULT_GROUP, &[]).sessions, 2);
    sharing
        .set_user("ada", Some("nlp"), None, &Limits::default(), &[])
        .await
        .unwrap();
    sharing.reserve_session("ada").unwrap();
    assert_eq!(sharing.holding(None, "nlp", &[]).sessions, 3);
    assert_eq!(sharing.holding(None, super::DEFAULT_GROUP, &[]).sessions, 0);
    assert_eq!(sharing.reserve_session("ada").unwrap_err().limit, Limit::Sessions);
    // To vision with her three: nlp is free again, vision full.
    sharing
        .set_user("ada", Some("vision"), None, &Limits::default(), &[])
        .await
        .unwrap();
    assert_eq!(sharing.holding(None, "nlp", &[]).sessions, 0);
    assert_eq!(sharing.holding(None, "vision", &[]).sessions, 3);
    assert!(sharing.reserve_session("ada").is_err());
    sharing.release_session("ada");
    assert_eq!(sharing.holding(None, "vision", &[]).sessions, 2);
    assert_eq!(sharing.holding(Some("ada"), "vision", &[]).sessions, 2);
}
