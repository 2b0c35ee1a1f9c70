//! `control_request` seeds: one line of each request kind, and the
//! daemon's answer of each shape (the target tries every input as both).

/// Every seed as (name, line).
pub fn seeds() -> Vec<(&'static str, String)> {
    let sa = r#"{"connection":"site-b","direction":"out","added":true,"spi":"0xc0ffee11","protocol":"esp","suite":"aes256gcm16","mode":"tunnel","encap":"udp","esn":true,"packets":12,"bytes":3400,"dummies":1,"drops":{"replay":2,"icv_failure":1},"next_seq":13,"seq_reserved":1048576,"seq_reserve_failed":1,"highest_seq":12,"lifetime":{"state":"soft_expired","soft_left":{"bytes":1,"packets":2,"secs":3},"hard_left":{}}}"#;
    let status = format!(
        r#"{{"ok":true,"status":{{"version":"0.1.0","pid":42,"uptime_secs":7,"config":"/etc/espgate/gw.toml","tun":{{"name":"espgate0","mtu":1438}},"encap":"udp","listen":"0.0.0.0:4500","fwmark":17664,"workers":2,"per_worker":[{{"tun_rx":1,"net_rx":2}}],"offloads":["udp_gso","udp_gro"],"state_dir":"/var/lib/espgate","connections":[{{"name":"site-b","mode":"tunnel","protocol":"esp","encap":"udp","local":"192.0.2.1","remote":"198.51.100.2:4500","local_ts":["10.1.0.0/16"],"remote_ts":["10.2.0.0/16"],"sas":[{sa}]}}],"drops":{{"no_policy":3}},"counters":{{"tun_rx":5,"keepalives":1}},"cluster":{{"name":"gw","node":2,"dispatch":"packet-rr","plan":{{"epoch":3,"members":[1,2]}},"leader":1,"plan_age_ms":250,"state":"forwarding","in_step":true,"sas":[{{"conn":"site-b","spi":4097,"outbound":true,"processed":5,"observed":6,"checkpoint":[512,99],"lockstep":"in-step","resyncs":1,"shared":true,"solo":2,"share_from":1000}}]}}}}}}"#
    );
    let shared = r#"{"conn":"site-b","outbound":true,"protocol":"esp","spi":4097,"suite":"aes128gcm16","enc_key":"000102030405060708090a0b0c0d0e0f10111213","integ_key":"","esn":false,"encap":[4500,4500],"owner":1,"share_from":77}"#;
    vec![
        ("req-status", r#"{"cmd":"status"}"#.into()),
        ("req-sa-list", r#"{"cmd":"sa_list"}"#.into()),
        (
            "req-sa-add",
            r#"{"cmd":"sa_add","conn":"site-b","dir":"in","spec":"spi=0x1000,suite=aes128gcm16,enc=000102030405060708090a0b0c0d0e0f10111213"}"#.into(),
        ),
        (
            "req-sa-del",
            r#"{"cmd":"sa_del","spi":4097,"proto":"qesp","dir":"out","conn":"site-b"}"#.into(),
        ),
        ("req-wireshark-keys", r#"{"cmd":"wireshark_keys"}"#.into()),
        ("req-costs", r#"{"cmd":"costs","action":"on"}"#.into()),
        ("req-initiate", r#"{"cmd":"initiate","conn":"x"}"#.into()),
        ("req-terminate", r#"{"cmd":"terminate","conn":"x"}"#.into()),
        (
            "req-cluster",
            format!(
                r#"{{"cmd":"cluster","plan":{{"epoch":3,"members":[1,3]}},"leader":1,"checkpoints":[{{"node":3,"spi":4097,"seq":512,"digest":99}}],"sas":[{shared}],"ike":[{{"conn":"site-b","owner":1,"state":"00ff"}}]}}"#
            ),
        ),
        ("req-cluster-export", r#"{"cmd":"cluster_export"}"#.into()),
        (
            "req-cluster-share",
            r#"{"cmd":"cluster_share","spi":4097,"outbound":false}"#.into(),
        ),
        ("ans-status", status),
        ("ans-sas", format!(r#"{{"ok":true,"sas":[{sa}]}}"#)),
        (
            "ans-keys",
            r#"{"ok":true,"sas":[{"connection":"site-b","direction":"in","protocol":"esp","spi":3237998081,"suite":"aes128-sha256","mode":"tunnel","src":"198.51.100.2","dst":"192.0.2.1","sport":4500,"dport":4500,"esn":false,"enc_key":"00112233445566778899aabbccddeeff","integ_key":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}]}"#.into(),
        ),
        (
            "ans-changed",
            r#"{"ok":true,"message":"added inbound SA 0x00001000","warnings":["connection \"b\" has no outbound SA"]}"#.into(),
        ),
        (
            "ans-cluster-sas",
            format!(
                r#"{{"ok":true,"generation":5,"sas":[{shared}],"ike":[{{"conn":"site-b","owner":1,"state":"00ff"}}]}}"#
            ),
        ),
        ("ans-error", r#"{"ok":false,"error":"no such connection"}"#.into()),
        ("ans-error-no-reason", r#"{"ok":false}"#.into()),
        ("lines", "{\"cmd\":\"status\"}\n{\"cmd\":\"sa_list\"}\n\n{\"ok\":true}".into()),
    ]
}
