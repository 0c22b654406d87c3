-- _limits.lua: not a script. scripts.py pastes it where a script says
-- '-- @include _limits': flow control's slots, parked tasks and rates (G14;
-- core/model/limits.py makes a push's gate, docs/flow-control.md says what it promises).
--
-- A gated task's hash carries its gate (push.lua writes it):
--   lim    the slots' scope ('' or absent: no concurrency limit)
--   lim_k  the key it waits under while no slot is free (turns between keys)
--   lim_n  the scope's capacity          lim_h  '1' while the task holds a slot
--   rt     the rate's scope ('' or absent: no rate)
--   rt_i   the emission interval, ms     rt_b   the burst allowance, ms
--   rt_h   '1' once its dispatch time was reserved (for this incarnation)
-- Per scope S, under the store's prefix P (unpartitioned stores only, where every key
-- is on the one server: the scopes' keys are named here, from the hash, not passed):
--   P:lim:S:run    hash, task id -> the fence it was granted at: the slots held
--   P:lim:S:ring   list of the keys with parked tasks, in turn order
--   P:lim:S:w:<k>  list of the task ids parked under key k, in push order
--   P:lim:R:tat    string, the rate scope R's theoretical arrival time (GCRA), ms
--   P:lim_scopes   set, the scopes with slots held or tasks parked (readers list them
--                  from here, never by a SCAN): added at a grant or a park, removed
--                  once the scope's slots and turn list are both empty
--   P:lim_rates    zset, rate scope -> when its reservation expires (ms): pruned at
--                  each reservation, the key itself expiring with the last one
-- Every one of them empties (and so vanishes) or expires by itself: no key is left
-- behind when the tasks are done (G7).
-- A slot is the task's from its grant to its end (commit, DLQ, cancel): a resurrected
-- or retried incarnation keeps it (an ordered key stays in order), a zombie's fence
-- moved, so its commit is refused and frees nothing.
-- Metrics (_metrics.lua, included before this file; mkey '' counts nothing), labelled
-- by a scope's family (the scope up to its key: 't:<task>' or 'n:<limit>', never one
-- label per key): 'thr:slot:<family>' and 'thr:rate:<family>' count the tasks that had
-- to wait for a slot or for their rate's time, 'h:lim_wait:<family>:*' observes the
-- wait from parked to granted (core/observe/measurements.py reads them).

local function limit_prefix(expiry_key)
  -- '<P>:expiry', as keys.py names the expiry index (tests/unit/test_limits.py).
  return string.sub(expiry_key, 1, -8)
end

local function limit_key(prefix, scope, what)
  return prefix .. ':lim:' .. scope .. ':' .. what
end

-- The scope is in use: readers find it in P:lim_scopes.
local function limit_in_use(prefix, scope)
  redis.call('SADD', prefix .. ':lim_scopes', scope)
end

-- The scope's last slot freed and its turn list empty: it leaves P:lim_scopes.
local function limit_maybe_idle(prefix, scope)
  if redis.call('EXISTS', limit_key(prefix, scope, 'run'), limit_key(prefix, scope, 'ring')) == 0 then
    redis.call('SREM', prefix .. ':lim_scopes', scope)
  end
end

local function limit_family(scope)
  return string.match(scope, '^[^|]*')
end

-- Due again now, in the schedule index, and the scanner leader woken for it.
local function limit_schedule(prefix, hash, id, at_text)
  redis.call('HSET', hash, 'state', 'scheduled')
  redis.call('ZADD', prefix .. ':sched', at_text, id)
  redis.call('DEL', prefix .. ':sched:wake')
  redis.call('LPUSH', prefix .. ':sched:wake', at_text)
end

-- The parked tasks of scope, handed the free slots in turn, key after key: each is
-- granted a slot and made due now (the leader dispatches it). Returns how many.
local function limit_hand_over(prefix, scope, capacity, now_text, mkey)
  local run, ring = limit_key(prefix, scope, 'run'), limit_key(prefix, scope, 'ring')
  local handed = 0
  while redis.call('HLEN', run) < capacity do
    local key = redis.call('LPOP', ring)
    if not key then
      break
    end
    local parked = limit_key(prefix, scope, 'w:' .. key)
    local next_id = redis.call('LPOP', parked)
    if redis.call('LLEN', parked) > 0 then
      redis.call('RPUSH', ring, key)  -- its next turn comes after every other key's
    end
    if next_id then
      local next_hash = prefix .. ':t:{' .. next_id .. '}'  -- keys.py's task(id)
      local g = redis.call('HMGET', next_hash, 'state', 'fence', 'parked_ms')
      if g[1] == 'parked' then
        metric_observe(mkey, 'lim_wait:' .. limit_family(scope),
          tonumber(now_text) - tonumber(g[3] or now_text))
        redis.call('HSET', run, next_id, g[2])
        redis.call('HSET', next_hash, 'lim_h', '1')
        limit_schedule(prefix, next_hash, next_id, now_text)
        handed = handed + 1
      end
    end
  end
  return handed
end

-- A push's gate (model/limits.py Gate.script_arg: its fields joined by tabs) written
-- into the task's hash. Returns the slots' scope ('' for none), the key and capacity.
local function limit_store_gate(hash, gate)
  local scope, key, capacity, rate, interval, burst =
    string.match(gate, '^([^\t]*)\t([^\t]*)\t(%d+)\t([^\t]*)\t(%d+)\t(%d+)$')
  redis.call('HSET', hash, 'lim', scope, 'lim_k', key, 'lim_n', capacity, 'rt', rate,
    'rt_i', interval, 'rt_b', burst)
  return scope, key, tonumber(capacity)
end

-- A task's end: its slot (if it holds one) freed and handed over; a parked task taken
-- out of its key's line. Call before the task's hash is deleted.
local function limit_release(prefix, hash, id, now_text, mkey)
  local g = redis.call('HMGET', hash, 'lim', 'lim_k', 'lim_n', 'lim_h', 'state')
  if not g[1] or g[1] == '' then
    return
  end
  if g[5] == 'parked' then
    local parked = limit_key(prefix, g[1], 'w:' .. (g[2] or ''))
    redis.call('LREM', parked, 1, id)
    if redis.call('LLEN', parked) == 0 then
      redis.call('LREM', limit_key(prefix, g[1], 'ring'), 0, g[2] or '')
    end
    limit_maybe_idle(prefix, g[1])
    return
  end
  if g[4] == '1' then
    redis.call('HDEL', limit_key(prefix, g[1], 'run'), id)
    redis.call('HSET', hash, 'lim_h', '0')
    limit_hand_over(prefix, g[1], tonumber(g[3]), now_text, mkey)
    limit_maybe_idle(prefix, g[1])
  end
end

-- A slot of scope for the task, if one is free; else the task waits in its key's line
-- (state 'parked', in no index: the script that frees a slot hands it one). True when
-- granted. Called by push.lua for a task due at once, so that a key's line is in push
-- order, and by the leader's dispatch for a task that was due later.
local function limit_take_slot(prefix, hash, id, scope, key, capacity, fence, now_ms, mkey)
  local run = limit_key(prefix, scope, 'run')
  limit_in_use(prefix, scope)
  if redis.call('HLEN', run) < capacity then
    redis.call('HSET', run, id, fence)
    redis.call('HSET', hash, 'lim_h', '1')
    return true
  end
  local parked = limit_key(prefix, scope, 'w:' .. key)
  if redis.call('RPUSH', parked, id) == 1 then
    redis.call('RPUSH', limit_key(prefix, scope, 'ring'), key)
  end
  redis.call('HSET', hash, 'state', 'parked', 'parked_ms', string.format('%d', now_ms))
  metric_count(mkey, 'thr:slot:' .. limit_family(scope))
  return false
end

-- At dispatch (schedule_take.lua): the task's rate, then its slot (unless it holds one).
-- Returns 'go' (dispatch it now), 'later' (its reserved dispatch time is to come: it
-- was made due then), or 'parked' (no slot free: it waits in its key's line).
local function limit_gate(prefix, hash, id, now_ms, mkey)
  local g = redis.call('HMGET', hash, 'lim', 'lim_k', 'lim_n', 'lim_h', 'rt', 'rt_i', 'rt_b',
    'rt_h', 'fence')
  if g[5] and g[5] ~= '' and g[8] ~= '1' then
    -- GCRA: each dispatch reserves the next emission time; one that falls beyond the
    -- burst allowance waits for it in the schedule index, no worker held.
    local tat_key = limit_key(prefix, g[5], 'tat')
    local interval, burst = tonumber(g[6]), tonumber(g[7])
    local tat = math.max(tonumber(redis.call('GET', tat_key) or '0'), now_ms)
    local at = math.max(now_ms, tat - burst)
    local expires = tat + interval + 1000
    redis.call('SET', tat_key, string.format('%d', tat + interval), 'PX',
      string.format('%d', expires - now_ms))
    local rates = prefix .. ':lim_rates'
    redis.call('ZADD', rates, string.format('%d', expires), g[5])
    redis.call('ZREMRANGEBYSCORE', rates, '-inf', string.format('(%d', now_ms))
    local last = redis.call('ZRANGE', rates, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', rates, string.format('%d', tonumber(last[2]) - now_ms))
    redis.call('HSET', hash, 'rt_h', '1')
    if at > now_ms then
      redis.call('ZADD', prefix .. ':sched', string.format('%d', at), id)
      metric_count(mkey, 'thr:rate:' .. limit_family(g[5]))
      return 'later'
    end
  end
  if g[1] and g[1] ~= '' and g[4] ~= '1' then
    if not limit_take_slot(prefix, hash, id, g[1], g[2] or '', tonumber(g[3]), g[9], now_ms,
        mkey) then
      redis.call('ZREM', prefix .. ':sched', id)
      return 'parked'
    end
  end
  return 'go'
end
