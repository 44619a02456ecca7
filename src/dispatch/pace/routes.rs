//! A pace per route: with relays of its own (`OUTBOXD_BULK_SMTP_URL`), the bulk lane is
//! paced apart from the transactional lane, from its own schedule, limit
//! (`OUTBOXD_BULK_RATE_LIMIT`) and replies, so that a bulk relay's throttling never slows a
//! sign-in code. Without them, both lanes share the transactional route's pace, as one
//! relay's limit covers both.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::{Allowance, Pace, RateLimit, ReplyCount, Slots};
use crate::message::{ClaimedMessage, Lane, Lanes};
use crate::store::Store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// The claimer's paces, one per route.
#[derive(Debug)]
pub(in crate::dispatch) struct Paces {
    transactional: Pace,
    /// The bulk lane's own; `None` when it shares the transactional route.
    bulk: Option<Pace>,
}

/// Where the send tasks count each route's replies.
#[derive(Debug, Clone)]
pub(in crate::dispatch) struct ReplyCounts {
    transactional: Arc<ReplyCount>,
    /// The same count as `transactional` when the lanes share a route.
    bulk: Arc<ReplyCount>,
}

impl ReplyCounts {
    /// The count of the route whose relays answered.
    pub fn of(&self, route: Lane) -> &ReplyCount {
        match route {
            Lane::Transactional => &self.transactional,
            Lane::Bulk => &self.bulk,
        }
    }
}

/// What the next claim may take: rows per tier and each route's send slots.
#[derive(Debug)]
pub(in crate::dispatch) struct Planned {
    /// The most rows of the transactional tiers, and of all when `bulk_limit` is `None`.
    pub limit: u32,
    /// The most rows of the bulk lane when it is paced apart.
    pub bulk_limit: Option<u32>,
    /// The lanes to claim: those whose circuit is closed and whose pace has room.
    pub lanes: Vec<Lane>,
    wanted: u32,
    slots: [Option<Slots>; 2],
}

/// The claim's plan, or how long the paces say to wait.
#[derive(Debug)]
pub(in crate::dispatch) enum Plan {
    Claim(Planned),
    Wait(Duration),
}

/// When each message of a claimed batch may be sent: its route's slots, counted along the
/// messages of that route.
#[derive(Debug, Clone, Default)]
pub(in crate::dispatch) struct SendSlots {
    routes: [Option<Slots>; 2],
    /// Each message's route and its place among that route's messages.
    places: Vec<(usize, usize)>,
}

impl SendSlots {
    /// When the message at `index` may be sent, if its route is paced.
    pub fn at(&self, booked: Instant, index: usize) -> Option<Instant> {
        let (route, place) = *self.places.get(index)?;
        Some(self.routes[route].as_ref()?.slot(booked, place))
    }
}

fn place(route: Lane) -> usize {
    match route {
        Lane::Transactional => 0,
        Lane::Bulk => 1,
    }
}

impl Paces {
    /// The bulk lane is paced apart when `bulk_apart` (it has relays of its own).
    pub fn new(limit: Option<RateLimit>, bulk_limit: Option<RateLimit>, bulk_apart: bool) -> Self {
        Self {
            transactional: Pace::new(limit, Lane::Transactional),
            bulk: bulk_apart.then(|| Pace::new(bulk_limit, Lane::Bulk)),
        }
    }

    pub fn reply_counts(&self) -> ReplyCounts {
        let transactional = self.transactional.reply_count();
        ReplyCounts {
            bulk: self
                .bulk
                .as_ref()
                .map_or_else(|| Arc::clone(&transactional), Pace::reply_count),
            transactional,
        }
    }

    /// The route that paces a lane's messages.
    fn route(&self, lane: Lane) -> Lane {
        if lane == Lane::Bulk && self.bulk.is_some() {
            Lane::Bulk
        } else {
            Lane::Transactional
        }
    }

    /// Before a claim of up to `wanted` rows per route of `lanes`: what each route's pace
    /// allows. A route with no room yet is left out of the claim; when none has room, the
    /// wait until the first does.
    pub async fn plan(
        &mut self,
        pool: &Store,
        wanted: u32,
        lanes: &[Lane],
        metrics: &Metrics,
    ) -> Result<Plan, sqlx::Error> {
        let Some(bulk) = self.bulk.as_mut() else {
            return Ok(
                match self.transactional.allowance(pool, wanted, metrics).await? {
                    Allowance::Take { rows, slots } => Plan::Claim(Planned {
                        limit: rows,
                        bulk_limit: None,
                        lanes: lanes.to_vec(),
                        wanted,
                        slots: [slots, None],
                    }),
                    Allowance::Wait(wait) => Plan::Wait(wait),
                },
            );
        };
        let mut planned = Planned {
            limit: 0,
            bulk_limit: Some(0),
            lanes: Vec::new(),
            wanted,
            slots: [None, None],
        };
        let mut wait: Option<Duration> = None;
        for lane in lanes.iter().copied() {
            let pace = match lane {
                Lane::Transactional => &mut self.transactional,
                Lane::Bulk => &mut *bulk,
            };
            match pace.allowance(pool, wanted, metrics).await? {
                Allowance::Take { rows, slots } => {
                    match lane {
                        Lane::Transactional => planned.limit = rows,
                        Lane::Bulk => planned.bulk_limit = Some(rows),
                    }
                    planned.slots[place(lane)] = slots;
                    planned.lanes.push(lane);
                }
                Allowance::Wait(after) => wait = Some(wait.map_or(after, |w| w.min(after))),
            }
        }
        Ok(match wait {
            Some(wait) if planned.lanes.is_empty() => Plan::Wait(wait),
            _ => Plan::Claim(planned),
        })
    }

    /// After the claim: each route's slots along its messages, its unused slots handed
    /// back, and whether its pace held sends back. True when some route took all it was
    /// allowed: more may be due.
    pub async fn claimed(
        &mut self,
        pool: &Store,
        planned: Planned,
        messages: &[ClaimedMessage],
        lanes: &Lanes,
        metrics: &Metrics,
    ) -> (SendSlots, bool) {
        let mut taken = [0_u32; 2];
        let places = messages
            .iter()
            .map(|message| {
                let route = place(self.route(lanes.of(&message.kind)));
                let at = taken[route];
                taken[route] += 1;
                (route, at as usize)
            })
            .collect();
        let allowed: Vec<(Lane, u32)> = match planned.bulk_limit {
            None => vec![(Lane::Transactional, planned.limit)],
            Some(bulk_limit) => planned
                .lanes
                .iter()
                .map(|lane| match lane {
                    Lane::Transactional => (Lane::Transactional, planned.limit),
                    Lane::Bulk => (Lane::Bulk, bulk_limit),
                })
                .collect(),
        };
        let mut full = false;
        for (route, allowed) in allowed {
            let taken = taken[place(route)];
            full |= allowed > 0 && taken >= allowed;
            let pace = match (route, self.bulk.as_mut()) {
                (Lane::Bulk, Some(bulk)) => bulk,
                _ => &mut self.transactional,
            };
            pace.claimed(planned.wanted, allowed, taken);
            let unused = allowed.saturating_sub(taken);
            if let Err(e) = pace.unused(pool, planned.slots[place(route)].as_ref(), unused).await {
                // The rows are claimed: send them. The schedule only runs a little slow.
                metrics.database_error(DatabaseOperation::Claim);
                warn!(error = %e, slots = unused, "could not hand unused send slots back");
            }
        }
        (
            SendSlots {
                routes: planned.slots,
                places,
            },
            full,
        )
    }
}
