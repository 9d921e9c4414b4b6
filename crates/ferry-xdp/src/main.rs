//! `ferry-adc`: the broker. `ferry-adc --policy FILE --socket PATH`.

use std::path::PathBuf;

fn main() {
    let mut policy = None;
    let mut socket = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--policy" => policy = args.next().map(PathBuf::from),
            "--socket" => socket = args.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!("usage: ferry-adc --policy FILE --socket PATH\n(see docs/adc.md)");
                return;
            }
            _ => {
                eprintln!("ferry-adc: unknown argument {a:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    let (Some(policy), Some(socket)) = (policy, socket) else {
        eprintln!("ferry-adc: --policy FILE and --socket PATH are required");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&policy).unwrap_or_else(|e| {
        eprintln!("ferry-adc: {}: {e}", policy.display());
        std::process::exit(2)
    });
    let policy = ferry_xdp::Policy::parse(&text).unwrap_or_else(|e| {
        eprintln!("ferry-adc: policy: {e}");
        std::process::exit(2)
    });
    let mut broker = ferry_xdp::Broker::new(policy.clone(), &socket).unwrap_or_else(|e| {
        eprintln!(
            "ferry-adc: cannot attach to {} (AF_XDP and BPF need root or CAP_BPF + CAP_NET_ADMIN + CAP_NET_RAW): {e}",
            policy.interface
        );
        std::process::exit(1)
    });
    println!(
        "ferry-adc: ready on {} ({:?}, {:?}) at {}",
        policy.interface,
        policy.steer,
        policy.attach,
        socket.display()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SIGTERM ends the process; the program, map and sockets go with it, and the next
    // broker replaces the socket file.
    if let Err(e) = broker.run(|| false) {
        eprintln!("ferry-adc: {e}");
        std::process::exit(1);
    }
}
