//! The test kit's fault scenarios (`longhaul_testkit::scenarios`), each run
//! on both kinds of cluster: in virtual time (the harness's real nodes on
//! real stores, messages judged by the same `Faults` rules, time moved by
//! ticks; a seed replays the run exactly) and on three in-process replicas
//! over real gRPC (a seed replays the fault pattern). `LONGHAUL_SEED`
//! replays one seed.

use longhaul_testkit::cluster::{GrpcCluster, Timers, VirtualCluster};
use longhaul_testkit::scenarios;
use longhaul_testkit::seed;

/// Runs a scenario on the virtual-time cluster (its futures never wait on a
/// clock; a current-thread runtime only polls them).
macro_rules! in_virtual_time {
    ($scenario:ident, $timers:expr, $seed:expr) => {{
        let seed = seed(stringify!($scenario), $seed);
        let mut cluster = VirtualCluster::new(seed, $timers);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(scenarios::$scenario(&mut cluster));
    }};
}

macro_rules! over_grpc {
    ($scenario:ident, $timers:expr, $seed:expr) => {{
        let seed = seed(stringify!($scenario), $seed);
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = GrpcCluster::start(dir.path(), seed, $timers).await;
        scenarios::$scenario(&mut cluster).await;
        cluster.stop().await;
    }};
}

#[test]
fn partitioned_minority_in_virtual_time() {
    in_virtual_time!(
        a_partitioned_minority_heals_without_disrupting_the_majority,
        Timers::Steady,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_minority_over_grpc() {
    over_grpc!(
        a_partitioned_minority_heals_without_disrupting_the_majority,
        Timers::Steady,
        1
    );
}

#[test]
fn compacted_log_in_virtual_time() {
    in_virtual_time!(
        a_follower_partitioned_while_the_log_is_compacted_catches_up_by_snapshot,
        Timers::Compacting,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_log_over_grpc() {
    over_grpc!(
        a_follower_partitioned_while_the_log_is_compacted_catches_up_by_snapshot,
        Timers::Compacting,
        2
    );
}

#[test]
fn drops_and_delays_in_virtual_time() {
    in_virtual_time!(
        acknowledged_writes_survive_random_drops_and_delays,
        Timers::Steady,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_and_delays_over_grpc() {
    over_grpc!(
        acknowledged_writes_survive_random_drops_and_delays,
        Timers::Steady,
        3
    );
}

#[test]
fn isolated_leader_in_virtual_time() {
    in_virtual_time!(
        an_isolated_leader_is_replaced_and_no_acknowledged_write_is_lost,
        Timers::Steady,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_over_grpc() {
    over_grpc!(
        an_isolated_leader_is_replaced_and_no_acknowledged_write_is_lost,
        Timers::Steady,
        4
    );
}

/// A scenario in virtual time replays from its seed event by event: the
/// same faults drawn, the same elections, the same entries at the same
/// ticks on every replica.
#[test]
fn a_virtual_time_scenario_replays_from_its_seed() {
    let run = |seed: u64| {
        let mut cluster = VirtualCluster::new(seed, Timers::Steady);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(scenarios::acknowledged_writes_survive_random_drops_and_delays(&mut cluster));
        let inner = cluster.inner();
        let fates = (inner.faults().dropped(), inner.faults().delayed());
        (inner.events.clone(), inner.now, inner.describe(), fates)
    };
    let (first, first_now, first_state, first_fates) = run(11);
    let (second, second_now, second_state, second_fates) = run(11);
    assert_eq!(first_now, second_now, "the runs took different times");
    assert_eq!(first_state, second_state);
    assert_eq!(
        first_fates, second_fates,
        "the same messages were dropped and delayed"
    );
    assert_eq!(
        first.keys().collect::<Vec<_>>(),
        second.keys().collect::<Vec<_>>()
    );
    for (id, events) in &first {
        let theirs = &second[id];
        assert_eq!(
            events.len(),
            theirs.len(),
            "replica {id}: event counts differ"
        );
        for (n, (a, b)) in events.iter().zip(theirs).enumerate() {
            assert_eq!(a, b, "replica {id}: event {n} differs");
        }
    }
    let (other, _, _, _) = run(12);
    assert_ne!(first, other, "another seed is another run");
}
