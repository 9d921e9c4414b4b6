//! VCM command vectors and datagram sockets (being written).
