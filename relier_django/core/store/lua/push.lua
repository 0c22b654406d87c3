-- push.lua: store a new task and, for idempotent tasks, claim its key, in one step.
-- Serves G1 (a task is stored, and covered by the expiry index, before it is sent)
-- and G4 (of N concurrent pushes of one idempotency key, exactly one claims it).
--
-- KEYS[1]  task hash            <p>:t:{id}
-- KEYS[2]  history list         <p>:h:{id}
-- KEYS[3]  expiry index (zset)  <p>:expiry
-- KEYS[4]  DLQ entry hash       <p>:dlq:e:{id}
-- KEYS[5]  outcome (result) key <p>:r:{id}
-- KEYS[6]  schedule index (zset) <p>:sched: task id -> due time, ms (Redis clock)
-- KEYS[7]  the scheduler's wake-up list <p>:sched:wake (one element at most)
-- KEYS[8]  metrics counters <p>:m ('' when metrics are off; see _metrics.lua)
-- KEYS[9]  metrics windows <p>:m:w (unused here; every counting script takes both)
-- KEYS[10..9+n]  admission counters (n = ARGV[7]; global, per task), see _admission.lua
-- KEYS[10+n]     idempotency key <p>:i:<task>:<sha256>   (only for idempotent tasks)
-- KEYS[#KEYS-1] the broker's queue list (only with ARGV[8+2n]; kombu's Redis transport)
-- KEYS[#KEYS]   that list's doorbell (transport.bell_of; only with ARGV[8+2n]): rung when
--                the message makes the list non-empty, to wake a worker waiting on it
-- ARGV[1]  task id
-- ARGV[2]  envelope, canonical JSON, fence 1
-- ARGV[3]  task name
-- ARGV[4]  queue
-- ARGV[5]  queued grace, ms: a stored task not started by then is re-dispatched (fenced),
--          which covers a producer that dies between this script and the broker send
-- ARGV[6]  max resurrections for this task: an integer, or limits by cause of death
--          ('3,oom=0': model/resurrections.py), read by resurrect.lua
-- ARGV[7]  n, the number of admission counters (0: admission control is off)
-- ARGV[8+2i], ARGV[9+2i]  limit and window (ms) of admission counter i (0-based)
-- ARGV[8+2n]  optional: the broker message, as kombu's Redis transport would LPUSH it.
--             Given, the task is stored and queued in this one step (G1 with no
--             window between the two: a producer that dies mid-push leaves neither);
--             the caller does not publish. '': the caller publishes after.
-- ARGV[9+2n]  push token: unique per push call, the same in a replay of that call (a
--             client retry after a lost reply). Every call answered "stored" is listed
--             in the hash (field 'push:<token>', count 'pushers'), so that abort.lua
--             undoes a store only when no other call that was told "stored" (an
--             identical replay() running beside it) still counts on it.
-- ARGV[10+2n] countdown, ms, or '': the task is due that long after now (Redis clock)
-- ARGV[11+2n] eta, epoch ms, or '': the task is due then (overrides the countdown)
-- ARGV[12+2n] expires after, ms from now, or ''; ARGV[13+2n] expires at, epoch ms, or ''
--             A task not started by then is dead-lettered (reason expired), never run.
-- ARGV[14+2n] the task's flow-control gate (model/limits.py Gate.script_arg: scope, key,
--             capacity, rate scope, interval ms, burst ms, tab-separated), or '': a
--             gated task due at once takes a slot of its scope or, none free, waits
--             'parked' in its key's line (push order); then, or at its countdown, it
--             is stored 'scheduled' for the leader's dispatch (schedule_take.lua),
--             which reserves its rate (and the slot of one due later) (G14; _limits.lua)
-- ARGV[15+2n] debounce (push_with(debounce_s=...)): RESULT_TTL_S in ms, or '' for a
--             push that is not debounced. Given, KEYS[#KEYS] is the debounce record
--             <p>:db:<task>:<sha256 of the key> (after any queue list; a debounced push
--             is due later, so it has none): see the debounce block below.
-- ARGV[16+2n] the audit ledger's horizon, ms ('', absent or 0: off): a task stored is
--             noted in its partition's ledger (_ledger.lua), for relier_audit
-- A task due later than now is stored 'scheduled' in the schedule index instead of the
-- expiry index, and not queued (the message, if given, is not pushed): the scanner
-- leader dispatches it when due (G11). The earliest due time wakes the leader.
-- RETURNS  {1, id, scheduled}  stored, fence 1 minted; scheduled: 1 when it waits in the
--                        schedule index (the caller publishes nothing), 2 when it
--                        was parked over its limit (waits in its key's line: the
--                        caller publishes nothing and tells it, task_parked), else 0.
--                        A replay of the call that parked it answers 2 again (the
--                        hash names that call: field 'park_push'), any other call 1
--          {0, other_id}  idempotent duplicate: other_id holds the claim
--          {-1, id}       a task with this id already exists (caller-chosen id reused)
--          {-2, id}       a DLQ entry holds this id: release or delete it first (an
--                         entry and a live task never share an id)
--          {-4, id}       a task with this id has finished and its outcome is still
--                         kept: pushing it again would run finished work twice (a
--                         replayed envelope, a reused caller-chosen id)
--          {-3, wait_ms}  refused by admission control: nothing stored, nothing
--                         counted; retry after wait_ms. Duplicates are not counted.
-- Re-running the same call (a client retry after a lost reply) returns {1, id} again,
-- without counting, queueing or listing it twice. Another call with the identical
-- envelope is answered {1, id} as well (the task it asked for is stored) and listed.
-- Counts: 'pushed' per task stored (not a duplicate, not a replay); 'refused' per call
-- refused by admission control (a client retry of a refused call counts again).
-- @include _admission
-- @include _metrics
-- @include _clock
-- @include _limits
-- @include _ledger
local id = ARGV[1]
local n = tonumber(ARGV[7] or '0')
local message = ARGV[8 + 2 * n]
local pusher = 'push:' .. ARGV[9 + 2 * n]
local countdown, eta = tonumber(ARGV[10 + 2 * n] or ''), tonumber(ARGV[11 + 2 * n] or '')
local expires_in, expires_at = tonumber(ARGV[12 + 2 * n] or ''), tonumber(ARGV[13 + 2 * n] or '')
local gate = ARGV[14 + 2 * n] or ''
local last = #KEYS
local queue_list, bell
if message and message ~= '' then
  queue_list, bell = KEYS[last - 1], KEYS[last]
  last = last - 2
end
-- >>> debounce (1/3): the record's key -----------------------------------------------
local debounce_ttl = tonumber(ARGV[15 + 2 * n] or '')
local record
if debounce_ttl then
  record = KEYS[last]
  last = last - 1
end
-- <<< debounce (1/3) -------------------------------------------------------------------
local idem
if last >= 10 + n then
  idem = KEYS[10 + n]
end
-- One EXISTS on the common path (none is there); which one only when one is.
if redis.call('EXISTS', KEYS[1], KEYS[4], KEYS[5]) > 0 then
  local existing = redis.call('HMGET', KEYS[1], 'env', 'state')
  if existing[1] then
    if existing[1] == ARGV[2] then
      if redis.call('HSETNX', KEYS[1], pusher, '1') == 1 then
        redis.call('HINCRBY', KEYS[1], 'pushers', '1')
      end
      if redis.call('HGET', KEYS[1], 'park_push') == pusher then
        return {1, id, 2}  -- a replay of the call that parked it: told as the first was
      end
      local waits = existing[2] == 'scheduled' or existing[2] == 'parked'
      return {1, id, waits and 1 or 0}
    end
    return {-1, id}
  end
  -- >>> debounce (2/3): a client retry of a push that a later one has superseded since
  -- finds its own envelope's digest in the outcome record, and is answered as before.
  local kept = redis.call('GET', KEYS[5])
  if kept and debounce_ttl
      and string.find(kept, '"of":"' .. redis.sha1hex(ARGV[2]) .. '"', 1, true) then
    return {1, id, 1}
  end
  -- <<< debounce (2/3) -----------------------------------------------------------------
  -- A client retry of a push whose task ran and committed before the retry came (its
  -- reply lost): the outcome names the push's token (outcome.succeeded), so the retry
  -- is answered as the first call was, stored, not as a second push of finished work.
  -- Both are canonical JSON (sorted keys): the envelope's own 'push' is followed by its
  -- 'queue', the record's by its 'result', which a value nested in the arguments or
  -- the result does not fake by chance.
  local token = string.match(ARGV[2], '"push":"(%x+)","queue":')
  if kept and token and string.find(kept, '"push":"' .. token .. '","result":', 1, true) then
    return {1, id, 1}  -- as if waiting: the caller sends nothing for a finished task
  end
  return {redis.call('EXISTS', KEYS[4]) == 1 and -2 or -4, id}
end
if idem then
  local holder = redis.call('GET', idem)
  if holder then
    return {0, holder}
  end
end
if n > 0 then
  local wait = admission_wait_ms(10, n, 8)
  if wait > 0 then
    metric_count(KEYS[8], 'refused')
    return {-3, wait}
  end
  admission_count(10, n, 8)
end
local now_ms, now_text = clock()
if idem then
  -- No TTL while unfinished: commit gives it one, failure deletes it (compare-and-delete).
  redis.call('SET', idem, id)
end
local due = eta or (countdown and now_ms + countdown)
local scheduled = due ~= nil and due > now_ms
if gate ~= '' then
  due, scheduled = math.max(due or now_ms, now_ms), true
end
redis.call('HSET', KEYS[1],
  'env', ARGV[2], 'fence', '1', 'state', scheduled and 'scheduled' or 'queued',
  'attempt', '1', 'res', '0', 'name', ARGV[3], 'queue', ARGV[4], 'idem', idem or '',
  'created_ms', now_text, 'maxres', ARGV[6], 'pushers', '1', pusher, '1')
metric_count(KEYS[8], 'pushed')
-- >>> debounce (3/3): supersede the task the record names, if it is still waiting -------
-- The record names the last debounced push of its key. That task, not dispatched yet
-- (fence 1, 'scheduled' or 'parked': schedule_take.lua deletes the record when it
-- leases it), is removed in this step and its outcome recorded 'superseded' (by this
-- task, with its own envelope's digest for a client retry of its push): of a burst
-- within the window, only the last runs. One already dispatched is left alone: this
-- push starts a new window. Its keys are built as keys.py's task/history/result build
-- them, so debounce needs an unpartitioned store (the producer refuses it otherwise).
if record then
  local prev = redis.call('GET', record)
  if prev and prev ~= id then
    local prefix = limit_prefix(KEYS[3])
    local hash = prefix .. ':t:{' .. prev .. '}'
    local p = redis.call('HMGET', hash, 'state', 'fence', 'env', 'lim')
    if (p[1] == 'scheduled' or p[1] == 'parked') and p[2] == '1' then
      if p[4] and p[4] ~= '' then
        limit_release(prefix, hash, prev, now_text, KEYS[8])
      end
      redis.call('DEL', hash, prefix .. ':h:{' .. prev .. '}')
      redis.call('ZREM', KEYS[6], prev)
      redis.call('SET', prefix .. ':r:{' .. prev .. '}', '{"by":"' .. id .. '","of":"'
        .. redis.sha1hex(p[3]) .. '","status":"superseded"}', 'PX', debounce_ttl)
    end
  end
  -- Outlives the task's due time by RESULT_TTL_S: a record still there past it (its
  -- task cancelled, or every scanner down) names a task the GET above finds gone.
  redis.call('SET', record, id, 'PX', math.floor((due or now_ms) - now_ms + debounce_ttl))
  redis.call('HSET', KEYS[1], 'db', record)
end
-- <<< debounce (3/3) -------------------------------------------------------------------
ledger_note(KEYS[3], ARGV[16 + 2 * n], now_ms, id)
if gate ~= '' then
  local scope, key, capacity = limit_store_gate(KEYS[1], gate)
  -- Due at once: its slot now, or its place in its key's line, in push order (one due
  -- later takes its slot when due, at the leader's dispatch).
  if scope ~= '' and due <= now_ms and not limit_take_slot(limit_prefix(KEYS[3]), KEYS[1],
      id, scope, key, capacity, '1', now_ms, KEYS[8]) then
    redis.call('HSET', KEYS[1], 'park_push', pusher)
    return {1, id, 2}
  end
end
if due then
  redis.call('HSET', KEYS[1], 'due_ms', ms(due))
end
local expires = expires_at or (expires_in and now_ms + expires_in)
if expires then
  redis.call('HSET', KEYS[1], 'expires_ms', ms(expires))
end
if scheduled then
  redis.call('ZADD', KEYS[6], ms(due), id)
  -- The new earliest due time: wake the leader, which sleeps until the one it knew.
  if redis.call('ZRANGE', KEYS[6], 0, 0)[1] == id then
    redis.call('DEL', KEYS[7])
    redis.call('LPUSH', KEYS[7], ms(due))
  end
  return {1, id, 1}
end
redis.call('ZADD', KEYS[3], ms(now_ms + tonumber(ARGV[5])), id)
-- The doorbell is rung by the message that makes the list non-empty: behind it, the
-- worker that takes the one before rings again (take.lua), so one ring per backlog.
if queue_list and redis.call('LPUSH', queue_list, message) == 1 then
  redis.call('ZADD', bell, '0', 'ring')
end
return {1, id, 0}
