//! Table tests of the rollout arithmetic, status and naming.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use super::*;

fn rs(name: &str, replicas: i32, available: i32) -> RsState {
    RsState {
        name: name.into(),
        replicas,
        actual: replicas,
        ready: available,
        available,
    }
}

#[test]
fn fenceposts_round_like_the_real_controller() {
    let pct = |s: &str| IntOrString::String(s.into());
    let cases = [
        (None, None, 4, (1, 1)),
        (None, None, 3, (1, 0)),
        (Some(pct("30%")), Some(pct("30%")), 10, (3, 3)),
        (Some(pct("25%")), Some(pct("25%")), 5, (2, 1)),
        (
            Some(IntOrString::Int(0)),
            Some(IntOrString::Int(0)),
            5,
            (0, 1),
        ),
        (Some(IntOrString::Int(2)), Some(pct("0%")), 5, (2, 0)),
        (Some(pct("0%")), Some(pct("10%")), 5, (0, 0)),
    ];
    for (surge, unavailable, replicas, want) in cases {
        // The last case has both zero after rounding: one pod may be unavailable.
        let want = if want == (0, 0) { (0, 1) } else { want };
        assert_eq!(
            resolve_fenceposts(surge.as_ref(), unavailable.as_ref(), replicas),
            want,
            "{surge:?} {unavailable:?} {replicas}"
        );
    }
}

#[test]
fn rolling_update_moves_in_the_real_steps() {
    // replicas 3, surge 1, unavailable 0: create the new set with 1, then wait for it.
    assert_eq!(
        rolling_steps(3, 1, 0, None, &[rs("old", 3, 3)]),
        [Step::CreateNew(1)]
    );
    let old = [rs("old", 3, 3)];
    // New at 1 but not available: total 4 = max, old cannot shrink (would drop below 3).
    assert_eq!(rolling_steps(3, 1, 0, Some(&rs("new", 1, 0)), &old), []);
    // New available: old shrinks by one.
    assert_eq!(
        rolling_steps(3, 1, 0, Some(&rs("new", 1, 1)), &old),
        [Step::Scale("old".into(), 2)]
    );
    // Then the new set grows again.
    assert_eq!(
        rolling_steps(3, 1, 0, Some(&rs("new", 1, 1)), &[rs("old", 2, 2)]),
        [Step::Scale("new".into(), 2)]
    );
    // Fresh deployment: everything at once.
    assert_eq!(rolling_steps(3, 1, 0, None, &[]), [Step::CreateNew(3)]);
    // Done: nothing to do.
    assert_eq!(
        rolling_steps(3, 1, 0, Some(&rs("new", 3, 3)), &[rs("old", 0, 0)]),
        []
    );
}

#[test]
fn unhealthy_old_replicas_go_first_and_max_unavailable_bounds_the_rest() {
    // replicas 4, surge 0, unavailable 2; the old set has one broken pod.
    let steps = rolling_steps(4, 0, 2, Some(&rs("new", 0, 0)), &[rs("old", 4, 3)]);
    // Cleanup takes the broken one, then one available more (3 available, minimum 2).
    assert_eq!(steps, [Step::Scale("old".into(), 2)]);
    // Several old sets shrink oldest first.
    let steps = rolling_steps(
        4,
        0,
        2,
        Some(&rs("new", 0, 0)),
        &[rs("oldest", 1, 1), rs("older", 3, 3)],
    );
    assert_eq!(
        steps,
        [
            Step::Scale("oldest".into(), 0),
            Step::Scale("older".into(), 2)
        ]
    );
    // Scaling the deployment down shrinks the new set.
    assert_eq!(
        rolling_steps(2, 1, 0, Some(&rs("new", 3, 3)), &[]),
        [Step::Scale("new".into(), 2)]
    );
}

#[test]
fn recreate_waits_for_old_pods() {
    let old = [rs("old", 2, 2)];
    assert_eq!(
        recreate_steps(2, None, &old, true),
        [Step::Scale("old".into(), 0)]
    );
    assert_eq!(recreate_steps(2, None, &[rs("old", 0, 0)], true), []);
    assert_eq!(
        recreate_steps(2, None, &[rs("old", 0, 0)], false),
        [Step::CreateNew(2)]
    );
    assert_eq!(
        recreate_steps(3, Some(&rs("new", 2, 2)), &[], false),
        [Step::Scale("new".into(), 3)]
    );
}

fn deployment(replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "d1", "generation": 2,
            "annotations": {"team": "a", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .expect("deployment")
}

#[test]
fn status_and_conditions_use_the_real_reasons() {
    let now: Timestamp = "2024-01-01T00:00:00Z".parse().expect("time");
    let d = deployment(3);
    // Three replicas at the default 25% may have none unavailable.
    let s = deployment_status(
        &d,
        Some(&rs("web-x", 3, 2)),
        &[rs("web-o", 1, 1)],
        false,
        now,
    );
    assert_eq!(
        (
            s.replicas,
            s.updated_replicas,
            s.available_replicas,
            s.unavailable_replicas
        ),
        (Some(4), Some(3), Some(3), Some(1))
    );
    assert_eq!(s.observed_generation, Some(2));
    let reasons: Vec<(String, String, Option<String>)> = s
        .conditions
        .expect("conditions")
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "Available".into(),
                "True".into(),
                Some("MinimumReplicasAvailable".into())
            ),
            (
                "Progressing".into(),
                "True".into(),
                Some("ReplicaSetUpdated".into())
            ),
        ]
    );
    let done = deployment_status(
        &d,
        Some(&rs("web-x", 3, 3)),
        &[rs("web-o", 0, 0)],
        false,
        now,
    );
    let progressing = &done.conditions.expect("conditions")[1];
    assert_eq!(
        progressing.reason.as_deref(),
        Some("NewReplicaSetAvailable")
    );
    assert_eq!(
        progressing.message.as_deref(),
        Some("ReplicaSet \"web-x\" has successfully progressed.")
    );
    let short = deployment_status(&d, Some(&rs("web-x", 3, 2)), &[], false, now);
    assert_eq!(
        short.conditions.expect("conditions")[0].reason.as_deref(),
        Some("MinimumReplicasUnavailable")
    );
}

#[test]
fn unchanged_conditions_keep_their_times() {
    let first: Timestamp = "2024-01-01T00:00:00Z".parse().expect("time");
    let later: Timestamp = "2024-01-01T01:00:00Z".parse().expect("time");
    let mut d = deployment(1);
    d.status = Some(deployment_status(
        &d,
        Some(&rs("web-x", 1, 1)),
        &[],
        false,
        first,
    ));
    let again = deployment_status(&d, Some(&rs("web-x", 1, 1)), &[], false, later);
    assert_eq!(d.status.as_ref(), Some(&again));
}

#[test]
fn new_replica_set_is_named_labeled_and_annotated() {
    let d = deployment(3);
    let hash = template_hash(&d.spec.clone().expect("spec").template, None).expect("hash");
    assert!(hash.bytes().all(|b| SAFE_ALPHABET.contains(&b)), "{hash}");
    assert_ne!(
        hash,
        template_hash(&d.spec.clone().expect("spec").template, Some(1)).expect("hash")
    );
    let rs = new_replica_set(&d, &hash, 1, 4, 4);
    assert_eq!(rs.metadata.name, Some(format!("web-{hash}")));
    let annotations = rs.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations[REVISION_ANNOTATION], "4");
    assert_eq!(annotations[DESIRED_REPLICAS_ANNOTATION], "3");
    assert_eq!(annotations[MAX_REPLICAS_ANNOTATION], "4");
    assert_eq!(annotations["team"], "a");
    assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    let spec = rs.spec.expect("spec");
    assert_eq!(
        spec.selector.match_labels.expect("labels")[POD_TEMPLATE_HASH],
        hash
    );
    let template_labels = spec
        .template
        .expect("t")
        .metadata
        .expect("m")
        .labels
        .expect("l");
    assert_eq!(template_labels[POD_TEMPLATE_HASH], hash);
    assert_eq!(
        rs.metadata.owner_references.expect("owner")[0].kind,
        "Deployment"
    );
}

#[test]
fn history_keeps_the_newest_idle_sets() {
    let set = |name: &str, revision: u32, replicas: i32| -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {REVISION_ANNOTATION: revision.to_string()}},
            "spec": {"replicas": replicas, "selector": {}},
            "status": {"replicas": replicas}
        }))
        .expect("rs")
    };
    let old = [
        set("r3", 3, 0),
        set("r1", 1, 0),
        set("r2", 2, 0),
        set("busy", 4, 1),
    ];
    assert_eq!(history_to_prune(&old, 1), ["r1", "r2"]);
    assert_eq!(history_to_prune(&old, 5), Vec::<String>::new());
    assert_eq!(history_to_prune(&old, 0), ["r1", "r2", "r3"]);
}

fn at(offset_secs: i64) -> Timestamp {
    let start: Timestamp = "2024-01-01T00:00:00Z".parse().expect("time");
    start
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(offset_secs))
        .expect("time")
}

fn progressing(status: &DeploymentStatus) -> DeploymentCondition {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .cloned()
        .expect("a Progressing condition")
}

/// (status, reason, message, lastUpdateTime, lastTransitionTime) in seconds after the start.
fn summary(c: &DeploymentCondition) -> (String, String, String, i64, i64) {
    let secs = |t: &Option<Time>| {
        t.as_ref()
            .map_or(-1, |t| t.0.as_second() - at(0).as_second())
    };
    (
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
        secs(&c.last_update_time),
        secs(&c.last_transition_time),
    )
}

#[test]
fn a_rollout_without_progress_exceeds_its_deadline_and_recovers_on_completion() {
    let mut d = deployment(2);
    d.spec.as_mut().expect("spec").progress_deadline_seconds = Some(10);
    let state = |actual: i32, ready: i32| RsState {
        name: "web-x".into(),
        replicas: 2,
        actual,
        ready,
        available: ready,
    };
    // (seconds, new ReplicaSet created this pass, its pods, its ready pods)
    let passes = [
        (0, true, 0, 0),
        (3, false, 2, 0),
        (8, false, 2, 0),
        (14, false, 2, 0),
        (20, false, 2, 0),
        (21, false, 2, 2),
    ];
    let mut seen = Vec::new();
    let mut deadlines = Vec::new();
    for (secs, created, actual, ready) in passes {
        let status = deployment_status(&d, Some(&state(actual, ready)), &[], created, at(secs));
        let c = progressing(&status);
        deadlines.push(progress_deadline(&d, Some(&c)).map(|t| t.as_second() - at(0).as_second()));
        seen.push(summary(&c));
        d.status = Some(status);
    }
    let text = seen
        .iter()
        .zip(&deadlines)
        .map(|(c, deadline)| format!("{c:?} deadline={deadline:?}"))
        .collect::<Vec<_>>()
        .join("\n");
    expect_test::expect![[r#"
        ("True", "NewReplicaSetCreated", "Created new replica set \"web-x\"", 0, 0) deadline=Some(10)
        ("True", "ReplicaSetUpdated", "ReplicaSet \"web-x\" is progressing.", 3, 0) deadline=Some(13)
        ("True", "ReplicaSetUpdated", "ReplicaSet \"web-x\" is progressing.", 3, 0) deadline=Some(13)
        ("False", "ProgressDeadlineExceeded", "ReplicaSet \"web-x\" has timed out progressing.", 14, 14) deadline=None
        ("False", "ProgressDeadlineExceeded", "ReplicaSet \"web-x\" has timed out progressing.", 14, 14) deadline=None
        ("True", "NewReplicaSetAvailable", "ReplicaSet \"web-x\" has successfully progressed.", 21, 21) deadline=None"#]]
    .assert_eq(&text);
}

#[test]
fn without_a_deadline_or_while_paused_nothing_times_out() {
    let stuck = RsState {
        name: "web-x".into(),
        replicas: 1,
        actual: 1,
        ready: 0,
        available: 0,
    };
    let mut d = deployment(1);
    d.spec.as_mut().expect("spec").progress_deadline_seconds = Some(i32::MAX);
    d.status = Some(deployment_status(&d, Some(&stuck), &[], true, at(0)));
    let later = deployment_status(&d, Some(&stuck), &[], false, at(100_000));
    // As upstream: with the deadline at MaxInt32 no Progressing condition is kept at all.
    let types: Vec<String> = later
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.clone())
        .collect();
    assert_eq!(types, ["Available"]);

    let mut d = deployment(1);
    d.spec.as_mut().expect("spec").progress_deadline_seconds = Some(5);
    d.spec.as_mut().expect("spec").paused = Some(true);
    let paused = deployment_status(&d, Some(&stuck), &[], false, at(100));
    assert_eq!(
        summary(&progressing(&paused)).1,
        "DeploymentPaused".to_owned()
    );
    assert_eq!(progress_deadline(&d, Some(&progressing(&paused))), None);
}
