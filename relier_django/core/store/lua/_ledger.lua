-- _ledger.lua: not a script. scripts.py pastes it where a script says '-- @include _ledger'.
--
-- The delivery ledger that `manage.py relier_audit` reconciles: one stream per partition,
-- '<P>:ledger', named from the expiry index's key (as _limits.lua names its keys), so it
-- lives in the partition's slot. Each entry, its stream id on the Redis clock, is
-- 'p' <id>: a task was stored (push.lua, a workflow successor made by commit.lua or
-- handover_store.lua). A store
-- undone because its publish failed (abort.lua: the push raised, so nothing was pushed)
-- takes its entry back, found from the task's 'created_ms' (the same script's clock, so
-- its entry is at or just after it).
-- Old entries are trimmed as new ones come (MINID ~: whole nodes, amortised O(1)), and the
-- key expires one horizon after the last entry. A caller passes horizon_ms '' or '0' when
-- the ledger is off (AUDIT_HORIZON_S = 0); each caller notes only after its replay check,
-- so a replayed call adds nothing. A server without MINID (Redis < 6.2) keeps no ledger:
-- the entry is dropped rather than the push refused.
local function ledger_note(expiry_key, horizon_ms, now_ms, id)
  local horizon = tonumber(horizon_ms or '') or 0
  if horizon <= 0 then
    return
  end
  local key = string.sub(expiry_key, 1, -8) .. ':ledger'
  local added = redis.pcall('XADD', key, 'MINID', '~', string.format('%d', now_ms - horizon),
    '*', 'p', id)
  if type(added) ~= 'table' or not added.err then
    redis.call('PEXPIRE', key, string.format('%d', horizon))
  end
end

-- The note of a store undone (abort.lua), taken back; an emptied ledger goes with it,
-- so an undone push leaves no key. Rare: a publish failed.
local function ledger_forget(expiry_key, created_ms, id)
  if not created_ms then
    return
  end
  local key = string.sub(expiry_key, 1, -8) .. ':ledger'
  for _, entry in ipairs(redis.call('XRANGE', key, created_ms, '+', 'COUNT', 1000)) do
    if entry[2][2] == id then
      redis.call('XDEL', key, entry[1])
      if redis.call('XLEN', key) == 0 then
        redis.call('DEL', key)
      end
      return
    end
  end
end
