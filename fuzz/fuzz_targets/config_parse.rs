//! Arbitrary text as a configuration file: the TOML parse, the schema and
//! every validator. A file that loads has an effective configuration
//! (`espgate config check`) that, written with its keys and loaded again,
//! says the same thing; a refused one has at least one diagnostic, placed
//! inside the text.
#![no_main]

use espgate_config::{parse, KeyText};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A key file named in the text is opened: keep the fuzzer to files it
    // cannot block on (a FIFO or a terminal under /dev, /proc, /sys).
    if ["/dev", "/proc", "/sys", ".."]
        .iter()
        .any(|p| text.contains(p))
    {
        return;
    }
    let base = Path::new("/nonexistent-espgate-fuzz");
    match parse(text, base, "fuzz.toml") {
        Ok(c) => {
            let written = toml::to_string(&c.effective(KeyText::Hex))
                .expect("an effective configuration always writes as TOML");
            let again = parse(&written, base, "effective.toml")
                .unwrap_or_else(|e| panic!("{e}\n--- written:\n{written}"));
            assert_eq!(again.gateway, c.gateway);
            assert_eq!(
                format!("{:?}", again.connections),
                format!("{:?}", c.connections)
            );
        }
        Err(e) => {
            assert!(!e.diagnostics.is_empty(), "a refusal says why");
            let lines = text.lines().count().max(1) + 1;
            for d in &e.diagnostics {
                if let Some((l, c)) = d.position {
                    assert!(l >= 1 && l <= lines && c >= 1, "{d:?} outside the text");
                }
            }
        }
    }
});
