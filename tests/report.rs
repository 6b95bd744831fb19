//! `longhaul simulate --report`: the HTML page rendered by a real browser (headless
//! Chromium), its screenshot decoded, and the charts found drawn in it: a line of every mode's
//! colour, and a page that is not blank.
//!
//! Without Chromium the test says why and passes, unless `LONGHAUL_REQUIRE_CHROMIUM` is set
//! (CI sets it and installs Debian's `chromium`, so there it must run).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use longhaul_cli::{Cli, run};

use crate::util::repo_root;

const REQUIRE: &str = "LONGHAUL_REQUIRE_CHROMIUM";
const WIDTH: u32 = 1600;
const HEIGHT: u32 = 1800;

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Runs headless Chromium on `page` and writes a screenshot to `png`, within a deadline.
fn screenshot(browser: &str, page: &Path, png: &Path, profile: &Path) {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--window-size={WIDTH},{HEIGHT}"),
            &format!("--screenshot={}", png.display()),
            &format!("file://{}", page.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{browser} failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{browser} took more than 120 s to take a screenshot");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_simulation_report_renders_in_a_browser_with_every_modes_line_drawn() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os(REQUIRE).is_none(),
            "{REQUIRE} is set but no chromium is installed"
        );
        eprintln!("skipped: no chromium on this machine (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let examples = repo_root().join("deploy/examples");
    let args = [
        "longhaul".to_string(),
        "simulate".into(),
        "--topology".into(),
        examples
            .join("three-sites-two-continents.toml")
            .display()
            .to_string(),
        "--job".into(),
        examples.join("dense-400b.job.toml").display().to_string(),
        "--sweep".into(),
        "distance-km=1,100,1000,3000,10000".into(),
        "--report".into(),
        page.display().to_string(),
    ];
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = run(Cli::try_parse_from(&args).unwrap(), &mut out, &mut err);
    assert_eq!(status, 0, "{}", String::from_utf8_lossy(&err));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<svg").count(), 3);

    let png = dir.path().join("report.png");
    screenshot(browser, &page, &png, &dir.path().join("profile"));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let rgb: Vec<[u8; 3]> = pixels[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let near = |p: &[u8; 3], c: [u8; 3]| p.iter().zip(c).all(|(&a, b)| a.abs_diff(b) <= 24);
    let count = |c: [u8; 3]| rgb.iter().filter(|p| near(p, c)).count();
    let white = count([255, 255, 255]);
    assert!(
        white < rgb.len() * 97 / 100,
        "the page is blank: {white} of {} pixels white",
        rgb.len()
    );
    // The report's colours: synchronous DP red, pipeline blue, DiLoCo green.
    for (mode, colour) in [
        ("sync-dp", [0xc0, 0x39, 0x2b]),
        ("pipeline", [0x29, 0x80, 0xb9]),
        ("diloco", [0x27, 0xae, 0x60]),
    ] {
        let n = count(colour);
        assert!(
            n > 300,
            "{mode}'s line is not drawn: {n} pixels of its colour"
        );
    }
}
