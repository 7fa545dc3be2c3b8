use super::*;

fn sha() -> CommitSha {
    CommitSha::parse("0123456789abcdef0123456789abcdef01234567").unwrap()
}

#[test]
fn tasks_of_one_process_link_the_same_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pointer = dir.path().join("snapshots").join("c").join("config.json");
    let target = Path::new("../../blobs/e");
    std::thread::scope(|scope| {
        let linking: Vec<_> = (0..16).map(|_| scope.spawn(|| link(&pointer, target))).collect();
        for task in linking {
            task.join().unwrap().unwrap();
        }
    });
    assert_eq!(std::fs::read_link(&pointer).unwrap(), target);
    let left: Vec<_> = std::fs::read_dir(pointer.parent().unwrap()).unwrap().collect();
    assert_eq!(left.len(), 1, "temporary links were left behind");
}

#[test]
fn a_commit_must_be_the_one_asked_for() {
    let asked = sha();
    assert_eq!(commit_problem(asked.as_str(), &asked), None);
    for hostile in [
        "../..",
        "../../../../tmp/x",
        "",
        "0123456789ABCDEF0123456789ABCDEF01234567",
    ] {
        assert!(commit_problem(hostile, &asked).is_some(), "{hostile}");
    }
    let other = "1123456789abcdef0123456789abcdef01234567";
    assert_eq!(commit_problem(other, &asked), Some("is not the commit asked for"));
}

#[test]
fn an_etag_must_be_a_hex_digest() {
    let git = "0123456789abcdef0123456789abcdef01234567";
    let sha256 = "a".repeat(64);
    assert_eq!(normalized_etag(&format!("\"{git}\"")).unwrap(), git);
    assert_eq!(normalized_etag(&format!("W/\"{sha256}\"")).unwrap(), sha256);
    assert_eq!(normalized_etag(git).unwrap(), git);
    for hostile in [
        "\"../../x/etag\"",
        "W/\"../../../etc/passwd\"",
        "\"\"",
        "\"0123456789abcdef0123456789abcdef0123456/\"",
        "\"abc\"",
        "\"0123456789abcdef0123456789abcdef01234567/..\"",
    ] {
        assert!(normalized_etag(hostile).is_err(), "{hostile}");
    }
}

#[test]
fn pointers_lead_back_to_the_blobs() {
    assert_eq!(pointer_target("config.json", "ab"), Path::new("../../blobs/ab"));
    assert_eq!(pointer_target("a/b/c.gguf", "ab"), Path::new("../../../../blobs/ab"));
}

#[test]
fn quoted_values_are_escaped_and_bounded() {
    assert_eq!(quoted(b"../\n"), "\"../\\n\"");
    assert!(quoted(&[b'x'; 1000]).chars().count() < MAX_QUOTED_VALUE + 5);
}

#[test]
fn content_ranges_are_read_strictly() {
    assert_eq!(
        parse_content_range("bytes 0-1048575/3158073"),
        Some((0, 1_048_575, 3_158_073))
    );
    for bad in [
        "bytes 0-9/*",
        "bytes */100",
        "0-9/100",
        "bytes -1-9/100",
        "bytes 0-+9/100",
        "",
    ] {
        assert_eq!(parse_content_range(bad), None, "{bad}");
    }
}

#[test]
fn relative_locations_are_told_apart() {
    assert!(is_relative("/Owner/repo/resolve/main/config.json"));
    assert!(!is_relative("https://cdn.example/x"));
    assert!(!is_relative("//cdn.example/x"));
}
