//! The capture reader (`espgate pcap` input) on arbitrary bytes: classic
//! pcap in both byte orders and resolutions, pcapng with any blocks, every
//! link type. It must return packets or an error, never panic, and every
//! packet it returns must start with an IP version nibble that fits.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = espgate_lab::capture::read_capture_bytes(data) {
        let mut frames = Vec::new();
        for (frame, p) in &report.packets {
            assert!(
                matches!(p.ip.first().map(|b| b >> 4), Some(4 | 6)),
                "frame {frame}"
            );
            assert!(p.ts_nsec < 1_000_000_000);
            frames.push(*frame);
        }
        frames.extend(report.skipped.iter().map(|(f, _)| *f));
        frames.sort_unstable();
        let n = frames.len();
        frames.dedup();
        assert_eq!(frames.len(), n, "a frame reported twice");
    }
});
