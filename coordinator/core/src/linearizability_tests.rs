use proptest::prelude::*;

use super::*;

type Ops = Vec<Operation<&'static str, u64>>;

fn operation(
    process: u64,
    op: Op<&'static str, u64>,
    invoked_at: u64,
    completed_at: Option<u64>,
    outcome: Outcome<u64>,
) -> Operation<&'static str, u64> {
    Operation {
        process,
        op,
        invoked_at,
        completed_at,
        outcome,
    }
}

fn write(
    process: u64,
    key: &'static str,
    value: u64,
    from: u64,
    to: u64,
) -> Operation<&'static str, u64> {
    operation(
        process,
        Op::Write { key, value },
        from,
        Some(to),
        Outcome::Ok(OpResult::Written),
    )
}

fn read(
    process: u64,
    key: &'static str,
    value: Option<u64>,
    from: u64,
    to: u64,
) -> Operation<&'static str, u64> {
    operation(
        process,
        Op::Read { key },
        from,
        Some(to),
        Outcome::Ok(OpResult::Read(value)),
    )
}

fn cas(
    process: u64,
    key: &'static str,
    expected: Option<u64>,
    new: u64,
    swapped: bool,
    from: u64,
    to: u64,
) -> Operation<&'static str, u64> {
    operation(
        process,
        Op::Cas { key, expected, new },
        from,
        Some(to),
        Outcome::Ok(OpResult::Cas { swapped }),
    )
}

fn unknown_write(
    process: u64,
    key: &'static str,
    value: u64,
    from: u64,
) -> Operation<&'static str, u64> {
    operation(
        process,
        Op::Write { key, value },
        from,
        None,
        Outcome::Unknown,
    )
}

/// Asserts the verdict; for a violation, also the key and the completion time it names.
fn check_verdict(ops: &Ops, expected: Option<(&'static str, u64)>) {
    match (check(ops), expected) {
        (Ok(()), None) => {}
        (Err(violation), Some((key, until))) => {
            assert_eq!(
                (violation.key, violation.until),
                (key, until),
                "{violation}"
            );
            assert_eq!(violation.culprit.completed_at, Some(until), "{violation}");
        }
        (verdict, expected) => panic!("expected {expected:?}, got {verdict:?}"),
    }
}

#[test]
fn sequential_and_overlapping_histories_are_linearizable() {
    check_verdict(&vec![], None);
    check_verdict(
        &vec![
            read(1, "k", None, 0, 1),
            write(1, "k", 1, 2, 3),
            read(1, "k", Some(1), 4, 5),
        ],
        None,
    );
    // A read concurrent with a write may see either value, and two reads may disagree as long
    // as the one that saw the new value does not precede the one that saw the old.
    check_verdict(
        &vec![
            write(1, "k", 1, 0, 1),
            write(2, "k", 2, 2, 10),
            read(3, "k", Some(2), 3, 4),
            read(4, "k", Some(1), 3, 5),
        ],
        None,
    );
}

#[test]
fn stale_read_is_a_violation() {
    let ops = vec![
        write(1, "k", 1, 0, 1),
        write(1, "k", 2, 2, 3),
        read(2, "k", Some(1), 4, 5),
        read(2, "k", Some(2), 6, 7),
    ];
    check_verdict(&ops, Some(("k", 5)));
}

#[test]
fn reads_going_back_in_time_are_a_violation() {
    let ops = vec![
        write(1, "k", 1, 0, 1),
        write(1, "k", 2, 2, 20),
        read(2, "k", Some(2), 3, 4),
        read(3, "k", Some(1), 5, 6),
    ];
    check_verdict(&ops, Some(("k", 6)));
}

#[test]
fn lost_write_is_a_violation() {
    let ops = vec![write(1, "k", 1, 0, 1), read(2, "k", None, 2, 3)];
    check_verdict(&ops, Some(("k", 3)));
}

#[test]
fn compare_and_set_anomalies_are_violations() {
    // Two concurrent CASes from "absent" cannot both swap.
    let both = vec![
        cas(1, "k", None, 1, true, 0, 5),
        cas(2, "k", None, 2, true, 1, 6),
    ];
    check_verdict(&both, Some(("k", 6)));
    let one = vec![
        cas(1, "k", None, 1, true, 0, 5),
        cas(2, "k", None, 2, false, 1, 6),
        read(3, "k", Some(1), 7, 8),
    ];
    check_verdict(&one, None);
    // A CAS that reports failure although the register held what it expected.
    let refused = vec![write(1, "k", 1, 0, 1), cas(1, "k", Some(1), 2, false, 2, 3)];
    check_verdict(&refused, Some(("k", 3)));
    // A CAS that swapped must be visible to a later read.
    let invisible = vec![
        write(1, "k", 1, 0, 1),
        cas(1, "k", Some(1), 2, true, 2, 3),
        read(2, "k", Some(1), 4, 5),
    ];
    check_verdict(&invisible, Some(("k", 5)));
}

#[test]
fn unknown_operations_may_take_effect_late_or_never() {
    // It took effect, long after it was given up on.
    let late = vec![
        unknown_write(1, "k", 1, 0),
        read(2, "k", None, 5, 6),
        read(2, "k", Some(1), 7, 8),
    ];
    check_verdict(&late, None);
    // It never took effect.
    let never = vec![unknown_write(1, "k", 1, 0), read(2, "k", None, 50, 60)];
    check_verdict(&never, None);
    // It took effect and was then overwritten.
    let overwritten = vec![
        unknown_write(1, "k", 1, 0),
        read(2, "k", Some(1), 1, 2),
        write(2, "k", 2, 3, 4),
        read(2, "k", Some(2), 5, 6),
    ];
    check_verdict(&overwritten, None);
    // But it takes effect at most once: it cannot be seen again after being overwritten.
    let twice = vec![
        unknown_write(1, "k", 1, 0),
        read(2, "k", Some(1), 1, 2),
        write(2, "k", 2, 3, 4),
        read(2, "k", Some(1), 5, 6),
    ];
    check_verdict(&twice, Some(("k", 6)));
    // An unknown CAS swaps only if it can.
    let unknown_cas = vec![
        write(1, "k", 1, 0, 1),
        operation(
            2,
            Op::Cas {
                key: "k",
                expected: Some(9),
                new: 3,
            },
            2,
            None,
            Outcome::Unknown,
        ),
        read(1, "k", Some(3), 4, 5),
    ];
    check_verdict(&unknown_cas, Some(("k", 5)));
    // It cannot take effect before it was invoked.
    let early = vec![read(2, "k", Some(1), 0, 1), unknown_write(1, "k", 1, 2)];
    check_verdict(&early, Some(("k", 1)));
}

#[test]
fn failed_operations_never_take_effect() {
    let ops = vec![
        operation(
            1,
            Op::Write { key: "k", value: 1 },
            0,
            Some(1),
            Outcome::Fail,
        ),
        read(2, "k", Some(1), 2, 3),
    ];
    check_verdict(&ops, Some(("k", 3)));
}

#[test]
fn keys_are_checked_independently_and_the_violation_names_its_key() {
    let ops = vec![
        write(1, "a", 1, 0, 1),
        write(2, "b", 1, 0, 1),
        read(1, "a", Some(1), 2, 3),
        write(1, "b", 2, 4, 5),
        read(2, "b", Some(1), 6, 7),
        read(1, "a", Some(1), 8, 9),
    ];
    let violation = check(&ops).unwrap_err();
    assert_eq!(violation.key, "b");
    let text = violation.to_string();
    assert!(text.contains("key \"b\" is not linearizable"), "{text}");
    assert!(
        text.contains("process 2 read \"b\": Some(1) [6, 7]"),
        "{text}"
    );
}

#[test]
fn violation_reports_the_shortest_failing_prefix() {
    let mut ops = vec![
        write(1, "k", 1, 0, 1),
        write(1, "k", 2, 2, 3),
        read(2, "k", Some(1), 4, 5),
    ];
    for i in 0..100 {
        ops.push(write(1, "k", 10 + i, 10 + 4 * i, 11 + 4 * i));
        ops.push(read(2, "k", Some(10 + i), 12 + 4 * i, 13 + 4 * i));
    }
    let violation = check(&ops).unwrap_err();
    assert_eq!(violation.until, 5);
    assert_eq!(violation.operations.len(), 3);
    assert_eq!(violation.culprit, ops[2]);
}

#[test]
fn history_records_and_refuses_nonsense() {
    let mut history = History::new();
    history
        .invoke(1, Op::Write { key: "k", value: 1 }, 0)
        .unwrap();
    assert_eq!(
        history.invoke(1, Op::Read { key: "k" }, 1),
        Err(HistoryError::ProcessBusy {
            process: 1,
            at: 1,
            open_since: 0
        })
    );
    assert_eq!(
        history.ok(1, OpResult::Read(None), 2),
        Err(HistoryError::WrongResult {
            process: 1,
            op: "write",
            result: "read"
        })
    );
    history.ok(1, OpResult::Written, 2).unwrap();
    assert_eq!(
        history.fail(1, 3),
        Err(HistoryError::NothingOpen { process: 1, at: 3 })
    );
    history.invoke(2, Op::Read { key: "k" }, 5).unwrap();
    assert_eq!(
        history.ok(2, OpResult::Read(Some(1)), 4),
        Err(HistoryError::CompletedBeforeInvoked {
            process: 2,
            invoked_at: 5,
            completed_at: 4
        })
    );
    history.ok(2, OpResult::Read(Some(1)), 6).unwrap();
    history
        .invoke(3, Op::Write { key: "k", value: 2 }, 7)
        .unwrap();
    history.unknown(3, 8).unwrap();
    // Still open at the end: counts as unknown.
    history
        .invoke(
            4,
            Op::Cas {
                key: "k",
                expected: Some(2),
                new: 3,
            },
            9,
        )
        .unwrap();
    assert_eq!(history.operations().len(), 4);
    assert_eq!(history.operations()[2].completed_at, None);
    history.check().unwrap();
}

/// One generated operation: which key, what kind, and how its interval and outcome are drawn.
#[derive(Debug, Clone)]
struct Step {
    key: usize,
    kind: u8,
    cas_choice: u8,
    early: u64,
    late: u64,
    fate: u8,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0..3usize, 0..3u8, 0..3u8, 0..40u64, 0..40u64, 0..10u8).prop_map(
            |(key, kind, cas_choice, early, late, fate)| Step {
                key,
                kind,
                cas_choice,
                early,
                late,
                fate,
            },
        ),
        1..60,
    )
}

const KEYS: [&str; 3] = ["a", "b", "c"];

/// Runs the steps one after another against a model, each taking effect at its own instant
/// inside an interval drawn around it, so that intervals overlap but the execution is
/// linearizable by construction. Some operations fail (no effect) or end unknown (with or
/// without effect).
fn sequential_execution(steps: &[Step]) -> Ops {
    let mut model: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut ops = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let key = KEYS[step.key];
        let instant = 100 + 10 * i as u64;
        let value = i as u64 + 1;
        let current = model.get(key).copied();
        let op = match step.kind {
            0 => Op::Write { key, value },
            1 => Op::Cas {
                key,
                expected: match step.cas_choice {
                    0 => None,
                    1 => current,
                    _ => Some(step.early % value + 1),
                },
                new: value,
            },
            _ => Op::Read { key },
        };
        // 0: fails; 1: unknown, no effect; 2: unknown, took effect; otherwise ok.
        let takes_effect = step.fate >= 2;
        let result = match &op {
            Op::Write { .. } => OpResult::Written,
            Op::Cas { expected, .. } => OpResult::Cas {
                swapped: *expected == current,
            },
            Op::Read { .. } => OpResult::Read(current),
        };
        if takes_effect {
            match &op {
                Op::Write { value, .. } => {
                    model.insert(key, *value);
                }
                Op::Cas { expected, new, .. } if *expected == current => {
                    model.insert(key, *new);
                }
                _ => {}
            }
        }
        let (completed_at, outcome) = match step.fate {
            0 => (Some(instant + step.late), Outcome::Fail),
            1 | 2 => (None, Outcome::Unknown),
            _ => (Some(instant + step.late), Outcome::Ok(result)),
        };
        ops.push(operation(
            i as u64,
            op,
            instant - step.early,
            completed_at,
            outcome,
        ));
    }
    ops
}

proptest! {
    #[test]
    fn sequential_executions_are_accepted(steps in steps()) {
        let ops = sequential_execution(&steps);
        prop_assert!(check(&ops).is_ok(), "{}", check(&ops).unwrap_err());
    }

    #[test]
    fn a_corrupted_read_is_rejected(steps in steps(), pick in any::<prop::sample::Index>()) {
        let mut ops = sequential_execution(&steps);
        let reads: Vec<usize> = (0..ops.len())
            .filter(|i| matches!(ops[*i].outcome, Outcome::Ok(OpResult::Read(_))))
            .collect();
        prop_assume!(!reads.is_empty());
        let corrupted = reads[pick.index(reads.len())];
        // No write or CAS ever stores 0.
        ops[corrupted].outcome = Outcome::Ok(OpResult::Read(Some(0)));
        let violation = check(&ops).unwrap_err();
        prop_assert_eq!(violation.key, *ops[corrupted].op.key());
        prop_assert_eq!(violation.until, ops[corrupted].completed_at.unwrap());
    }
}
