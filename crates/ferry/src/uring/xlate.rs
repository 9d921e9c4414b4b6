//! xlate: the registration cache (being written).
