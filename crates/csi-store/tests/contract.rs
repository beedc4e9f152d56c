//! The `RecordStore` contract, checked on both implementations: what a
//! driver's unit tests see with `FakeStore` is what it gets with `FileStore`.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_store::{
    CachedTable, CodecId, FakeStore, FileStore, Prost, RawRecord, RecordStore, StoreError, Table,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Volume {
    name: String,
    capacity_bytes: i64,
    parameters: BTreeMap<String, String>,
}

fn volume(name: &str, capacity_bytes: i64) -> Volume {
    Volume {
        name: name.into(),
        capacity_bytes,
        parameters: BTreeMap::from([("type".into(), "fast".into())]),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct Publish {
    #[prost(string, tag = "1")]
    volume_id: String,
    #[prost(bool, tag = "2")]
    readonly: bool,
}

/// Runs `check` on a fresh store of each kind.
fn both(check: impl Fn(Arc<dyn RecordStore>)) {
    check(Arc::new(FakeStore::new()));
    let dir = tempfile::tempdir().unwrap();
    check(Arc::new(FileStore::open(dir.path()).unwrap()));
}

#[test]
fn put_get_overwrite_delete() {
    both(|store| {
        let vols: Table<Volume> = Table::with_shared(store.clone(), "volumes").unwrap();
        assert_eq!(vols.get("vol-1").unwrap(), None);
        assert!(!vols.delete("vol-1").unwrap(), "{store:?}");
        vols.put("vol-1", &volume("pvc-1", 1)).unwrap();
        assert_eq!(vols.get("vol-1").unwrap(), Some(volume("pvc-1", 1)));
        vols.put("vol-1", &volume("pvc-1", 2)).unwrap();
        assert_eq!(vols.get("vol-1").unwrap(), Some(volume("pvc-1", 2)));
        assert!(vols.delete("vol-1").unwrap());
        assert_eq!(vols.get("vol-1").unwrap(), None);
        assert!(!vols.delete("vol-1").unwrap(), "delete is idempotent");
    });
}

#[test]
fn prost_tables_hold_protobuf_messages() {
    both(|store| {
        let published: Table<Publish, Prost> = Table::with_shared(store, "published").unwrap();
        let target = "/var/lib/kubelet/pods/p-1/volumes/kubernetes.io~csi/pvc-1/mount";
        let msg = Publish {
            volume_id: "vol-1".into(),
            readonly: true,
        };
        published.put(target, &msg).unwrap();
        assert_eq!(published.get(target).unwrap(), Some(msg.clone()));
        let scan = published.scan().unwrap();
        assert_eq!(scan.records, vec![(target.to_string(), msg)]);
    });
}

#[test]
fn scan_lists_every_record_in_key_order_and_tables_are_separate() {
    both(|store| {
        let vols: Table<Volume> = Table::with_shared(store.clone(), "volumes").unwrap();
        let snaps: Table<Volume> = Table::with_shared(store, "snapshots").unwrap();
        assert!(
            vols.scan().unwrap().records.is_empty(),
            "never-written table"
        );
        for i in [3, 1, 2] {
            vols.put(&format!("vol-{i}"), &volume(&format!("pvc-{i}"), i))
                .unwrap();
        }
        snaps.put("snap-1", &volume("s", 9)).unwrap();
        let scan = vols.scan().unwrap();
        let keys: Vec<_> = scan.records.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["vol-1", "vol-2", "vol-3"]);
        assert_eq!(scan.records[1].1, volume("pvc-2", 2));
        assert!(scan.quarantined.is_empty());
        assert_eq!(snaps.scan().unwrap().records.len(), 1);
        assert_eq!(vols.get("snap-1").unwrap(), None);
    });
}

#[test]
fn any_string_is_a_key_up_to_the_limit() {
    both(|store| {
        let t: Table<u32> = Table::with_shared(store, "odd").unwrap();
        let long = "k".repeat(csi_store::MAX_KEY_LEN);
        let keys = [
            "..",
            ".",
            "../../etc/passwd",
            "a/b",
            "with space",
            "ünï",
            "~x",
            "#y",
            ".tmp-1-1",
            long.as_str(),
        ];
        for (i, k) in keys.iter().enumerate() {
            t.put(k, &(i as u32)).unwrap();
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k).unwrap(), Some(i as u32), "{k:?}");
        }
        let scan = t.scan().unwrap();
        assert_eq!(scan.records.len(), keys.len());
        assert!(scan.quarantined.is_empty(), "{:?}", scan.quarantined);
        assert!(matches!(
            t.put("", &1),
            Err(StoreError::InvalidKey {
                reason: "empty",
                ..
            })
        ));
        let too_long = "k".repeat(csi_store::MAX_KEY_LEN + 1);
        assert!(matches!(
            t.put(&too_long, &1),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(matches!(
            t.get(&too_long),
            Err(StoreError::InvalidKey { .. })
        ));
    });
}

#[test]
fn bad_table_names_are_refused() {
    both(|store| {
        for bad in ["", "../x", "a/b", "Volumes", "."] {
            assert!(
                matches!(
                    Table::<u8>::with_shared(store.clone(), bad),
                    Err(StoreError::InvalidTable { .. })
                ),
                "{bad:?}"
            );
            assert!(store.put(bad, "k", CodecId::JSON, b"1").is_err());
            assert!(store.scan(bad).is_err());
        }
    });
}

#[test]
fn a_record_of_another_codec_or_undecodable_is_quarantined_not_fatal() {
    both(|store| {
        let vols: Table<Volume> = Table::with_shared(store.clone(), "volumes").unwrap();
        let as_prost: Table<Publish, Prost> = Table::with_shared(store.clone(), "volumes").unwrap();
        vols.put("vol-good", &volume("a", 1)).unwrap();
        as_prost
            .put(
                "vol-prost",
                &Publish {
                    volume_id: "x".into(),
                    readonly: false,
                },
            )
            .unwrap();
        store
            .put("volumes", "vol-badjson", CodecId::JSON, br#"{"name": 5}"#)
            .unwrap();

        let scan = vols.scan().unwrap();
        assert_eq!(scan.records, vec![("vol-good".to_string(), volume("a", 1))]);
        let mut q: Vec<_> = scan
            .quarantined
            .iter()
            .map(|q| (q.key.clone().unwrap(), q.reason.clone()))
            .collect();
        q.sort();
        assert_eq!(q.len(), 2, "{q:?}");
        assert_eq!(q[0].0, "vol-badjson");
        assert!(q[0].1.contains("JSON"), "{}", q[0].1);
        assert_eq!(q[1].0, "vol-prost");
        assert_eq!(q[1].1, "written with codec prost, this table reads json");
        assert_eq!(
            vols.quarantined_keys().unwrap(),
            ["vol-badjson", "vol-prost"]
        );
        // Gone from the table: the next scan is clean.
        let again = vols.scan().unwrap();
        assert!(again.quarantined.is_empty());
        assert_eq!(again.records.len(), 1);
    });
}

#[test]
fn get_of_an_undecodable_record_quarantines_it_and_says_so() {
    both(|store| {
        let vols: Table<Volume> = Table::with_shared(store.clone(), "volumes").unwrap();
        store
            .put(
                "volumes",
                "vol-1",
                CodecId::JSON,
                br#"{"secret":"hunter2"}"#,
            )
            .unwrap();
        let err = vols.get("vol-1").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        assert!(
            text.contains("volumes/vol-1") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(vols.get("vol-1").unwrap(), None);
        assert_eq!(vols.quarantined_keys().unwrap(), ["vol-1"]);
    });
}

#[test]
fn a_quarantine_request_for_a_record_that_changed_meanwhile_is_ignored() {
    both(|store| {
        store.put("t", "k", CodecId::JSON, b"1").unwrap();
        let stale = RawRecord {
            codec: CodecId::JSON,
            bytes: b"0".to_vec(),
        };
        assert_eq!(store.quarantine("t", "k", &stale, "bad").unwrap(), None);
        assert!(store.get("t", "k").unwrap().is_some());
        assert_eq!(
            store.quarantine("t", "absent", &stale, "bad").unwrap(),
            None
        );
    });
}

#[test]
fn oversized_records_are_refused() {
    both(|store| {
        let big = vec![0u8; csi_store::MAX_RECORD_LEN + 1];
        assert!(matches!(
            store.put("t", "k", CodecId::PROST, &big),
            Err(StoreError::TooLarge { .. })
        ));
        assert_eq!(store.get("t", "k").unwrap(), None);
    });
}

#[test]
fn concurrent_writers_all_land() {
    both(|store| {
        let t: Table<u64> = Table::with_shared(store, "many").unwrap();
        std::thread::scope(|s| {
            for w in 0..8u64 {
                let t = t.clone();
                s.spawn(move || {
                    for i in 0..25 {
                        t.put(&format!("w{w}-{i}"), &(w * 100 + i)).unwrap();
                    }
                });
            }
        });
        let scan = t.scan().unwrap();
        assert_eq!(scan.records.len(), 200);
        assert!(scan.records.iter().any(|(k, v)| k == "w7-24" && *v == 724));
    });
}

#[test]
fn cached_table_shows_only_durable_changes() {
    both(|store| {
        let t: Table<Volume> = Table::with_shared(store.clone(), "volumes").unwrap();
        t.put("vol-0", &volume("zero", 0)).unwrap();
        let (cached, quarantined) = CachedTable::load(t.clone()).unwrap();
        assert!(quarantined.is_empty());
        assert_eq!(cached.len(), 1);
        cached.put("vol-1", volume("one", 1)).unwrap();
        let grown = cached
            .update("vol-1", |v| {
                let v = v.as_mut().expect("present");
                v.capacity_bytes = 10;
                Ok::<_, StoreError>(v.capacity_bytes)
            })
            .unwrap();
        assert_eq!(grown, 10);
        assert_eq!(t.get("vol-1").unwrap().unwrap().capacity_bytes, 10);

        // An error from the closure changes nothing.
        let err = cached
            .update("vol-1", |v| {
                *v = None;
                Err::<(), _>(StoreError::InvalidKey {
                    key: "x".into(),
                    reason: "test",
                })
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidKey { .. }));
        assert!(cached.contains_key("vol-1"));

        // Clearing through update deletes the record.
        cached
            .update("vol-0", |v| {
                *v = None;
                Ok::<_, StoreError>(())
            })
            .unwrap();
        assert_eq!(t.get("vol-0").unwrap(), None);
        assert!(cached.delete("vol-1").unwrap());
        assert!(cached.is_empty());
        assert!(t.scan().unwrap().records.is_empty());
        let (reloaded, _) = CachedTable::load(t).unwrap();
        assert!(reloaded.is_empty());
    });
}

#[test]
fn fake_store_full_disk_refuses_puts_keeps_deletes_and_memory() {
    let store = FakeStore::new();
    let t: Table<Volume> = Table::new(&store, "volumes").unwrap();
    t.put("vol-1", &volume("a", 1)).unwrap();
    let (cached, _) = CachedTable::load(t.clone()).unwrap();
    store.set_full(true);
    let err = cached.put("vol-2", volume("b", 2)).unwrap_err();
    assert!(err.is_no_space(), "{err:?}");
    assert!(
        !cached.contains_key("vol-2"),
        "memory never runs ahead of disk"
    );
    assert!(cached.delete("vol-1").unwrap());
    store.set_full(false);
    cached.put("vol-2", volume("b", 2)).unwrap();
    assert_eq!(store.counts(), (2, 1), "the refused put is not counted");
}

#[test]
fn fake_store_unreadable_records_are_quarantined_like_files() {
    let store = FakeStore::new();
    let t: Table<Volume> = Table::new(&store, "volumes").unwrap();
    t.put("vol-1", &volume("a", 1)).unwrap();
    store.insert_unreadable("volumes", "vol-2", "checksum mismatch");
    store.insert_raw(
        "volumes",
        "vol-3",
        RawRecord {
            codec: CodecId::PROST,
            bytes: vec![1, 2],
        },
    );
    let scan = t.scan().unwrap();
    assert_eq!(scan.records.len(), 1);
    let reasons: Vec<_> = scan.quarantined.iter().map(|q| q.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "checksum mismatch",
            "written with codec prost, this table reads json"
        ]
    );
    assert_eq!(t.quarantined_keys().unwrap(), ["vol-2", "vol-3"]);
    store.insert_unreadable("volumes", "vol-4", "truncated");
    assert!(matches!(t.get("vol-4"), Err(StoreError::Corrupt { .. })));
    assert_eq!(t.get("vol-4").unwrap(), None);
}
